/* q3.c — Nexmark q3, local item suggestion, as a sluice job
 * (the shared rules of every query: query.h). */

#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "query.h"

#define Q3_CATEGORY 10

/* q3: local item suggestion.
 *
 *   SELECT P.name, P.city, P.state, A.id
 *   FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
 *   WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID'
 *                              OR P.state = 'CA');
 *
 * q3.split (process) applies both WHERE conditions and projects: auctions
 * {id, seller} on its main output, persons {id, name, city, state} on port
 * 1.  Each side is keyed by the join key (seller, person id) into
 * sl_op_join, the unbounded join of two insert-only tables, whose join
 * function emits one row per pair.  Its state keeps every matching auction
 * and person (sluice_join.h, CAVEATS); they are few after the filters. */

typedef struct q3_auction {
  int64_t id, seller;
} q3_auction;

static bool q3_state_wanted(nx_str state) {
  static const char wanted[3][2] = {{'O', 'R'}, {'I', 'D'}, {'C', 'A'}};
  if (state.len != 2)
    return false;
  for (int i = 0; i < 3; i++)
    if (memcmp(state.ptr, wanted[i], 2) == 0)
      return true;
  return false;
}

static int q3_person(sl_ctx *ctx, const sl_record *in) {
  nx_event e;
  if (nx_decode(in->data, in->size_bytes, &e) != 0)
    return malformed(ctx, in);
  const nx_person *p = &e.u.person;
  if (!q3_state_wanted(p->state))
    return 0;
  if (p->name.len > NX_MAX_STRING_BYTES || p->city.len > NX_MAX_STRING_BYTES)
    return malformed(ctx, in);
  _Alignas(8) char buffer[sizeof(q3_row) + 3 * NX_MAX_STRING_BYTES];
  q3_row head = {p->id, (uint16_t)p->name.len, (uint16_t)p->city.len,
                 (uint16_t)p->state.len, 0};
  memcpy(buffer, &head, sizeof head);
  char *text = buffer + sizeof head;
  memcpy(text, p->name.ptr, p->name.len);
  memcpy(text + p->name.len, p->city.ptr, p->city.len);
  memcpy(text + p->name.len + p->city.len, p->state.ptr, p->state.len);
  uint32_t size =
      (uint32_t)sizeof head + p->name.len + p->city.len + p->state.len;
  return sl_emit_side(ctx, 1, buffer, size, in->timestamp);
}

static int q3_split(sl_ctx *ctx, void *state, int input,
                    const sl_record *in) {
  const nx_record *r = event_of(in);
  if (!r)
    return malformed(ctx, in);
  if (r->type == NX_PERSON)
    return q3_person(ctx, in);
  if (r->type != NX_AUCTION ||
      r->field[NX_AUCTION_CATEGORY] != Q3_CATEGORY)
    return 0;
  q3_auction a = {r->field[NX_AUCTION_ID], r->field[NX_AUCTION_SELLER]};
  return sl_emit(ctx, &a, sizeof a);
}

static uint64_t q3_auction_seller(void *user, const sl_record *in) {
  return (uint64_t)((const q3_auction *)in->data)->seller;
}

static uint64_t q3_person_id(void *user, const sl_record *in) {
  return (uint64_t)((const q3_row *)in->data)->id;
}

/* One (auction, person) pair: the person's record with the auction's id. */
static int q3_pair(void *user, sl_ctx *ctx, uint64_t key,
                   const sl_record *left, const sl_record *right) {
  assert(left->size_bytes == sizeof(q3_auction));
  assert(right->size_bytes >= sizeof(q3_row));
  _Alignas(8) char buffer[sizeof(q3_row) + 3 * NX_MAX_STRING_BYTES];
  if (right->size_bytes > sizeof buffer)
    return malformed(ctx, right);
  memcpy(buffer, right->data, right->size_bytes);
  q3_row head;
  memcpy(&head, buffer, sizeof head);
  head.id = ((const q3_auction *)left->data)->id;
  memcpy(buffer, &head, sizeof head);
  return sl_emit(ctx, buffer, right->size_bytes);
}

int nxq_build_q3(sl_job *job, sl_op *events, int p, sl_op **result) {
  static const sl_process_ops split = {.process = q3_split};
  sl_op *auctions, *persons, *by_seller, *by_id;
  int rc = sl_op_process(job, "q3.split", &events, 1, p, &split, NULL,
                         &auctions);
  if (rc == 0)
    rc = sl_op_side_output(job, "q3.persons", auctions, 1, &persons);
  if (rc == 0)
    rc = sl_op_key_by(job, "q3.auctions-by-seller", auctions,
                      q3_auction_seller, NULL, &by_seller);
  if (rc == 0)
    rc = sl_op_key_by(job, "q3.persons-by-id", persons, q3_person_id, NULL,
                      &by_id);
  if (rc == 0)
    rc = sl_op_join(job, "q3.join", by_seller, by_id, p, q3_pair, NULL,
                    result);
  return rc;
}
