/* model.c — the Nexmark event record: encoding a view into an nx_record
 * and decoding one back (nexmark.h has the layout).
 *
 * A record is the 16-byte head (type, six string lengths), the kind's
 * integer fields, then its strings back to back, padded with zeros to a
 * multiple of 8 so records stay 8-byte aligned in the rings.  Decoding
 * checks every length against the record's size before it builds a
 * pointer, so a malformed record is refused, never read past. */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "nexmark.h"

/* Integer fields and strings of each kind, in nexmark.h's order. */
static const uint32_t kind_integers[3] = {2, 7, 4};
static const uint32_t kind_strings[3] = {6, 3, 3};

static int kind_valid(uint32_t type) { return type <= NX_BID; }

/* The strings of e in order, as pointers into the view (n: how many). */
static uint32_t view_strings(const nx_event *e, const nx_str *out[6]) {
  switch (e->type) {
  case NX_PERSON:
    out[0] = &e->u.person.name;
    out[1] = &e->u.person.email_address;
    out[2] = &e->u.person.credit_card;
    out[3] = &e->u.person.city;
    out[4] = &e->u.person.state;
    out[5] = &e->u.person.extra;
    return 6;
  case NX_AUCTION:
    out[0] = &e->u.auction.item_name;
    out[1] = &e->u.auction.description;
    out[2] = &e->u.auction.extra;
    return 3;
  case NX_BID:
    out[0] = &e->u.bid.channel;
    out[1] = &e->u.bid.url;
    out[2] = &e->u.bid.extra;
    return 3;
  default:
    return 0;
  }
}

/* The integers of e in order (n: how many). */
static uint32_t view_integers(const nx_event *e, int64_t out[7]) {
  switch (e->type) {
  case NX_PERSON:
    out[0] = e->u.person.id;
    out[1] = e->u.person.date_time;
    return 2;
  case NX_AUCTION:
    out[0] = e->u.auction.id;
    out[1] = e->u.auction.initial_bid;
    out[2] = e->u.auction.reserve;
    out[3] = e->u.auction.date_time;
    out[4] = e->u.auction.expires;
    out[5] = e->u.auction.seller;
    out[6] = e->u.auction.category;
    return 7;
  case NX_BID:
    out[0] = e->u.bid.auction;
    out[1] = e->u.bid.bidder;
    out[2] = e->u.bid.price;
    out[3] = e->u.bid.date_time;
    return 4;
  default:
    return 0;
  }
}

static uint32_t round8(uint32_t n) { return (n + 7u) & ~7u; }

uint32_t nx_encoded_size(const nx_event *e) {
  if (e == NULL || e->type < 0 || !kind_valid((uint32_t)e->type)) return 0;
  const nx_str *s[6];
  uint32_t n = view_strings(e, s);
  uint32_t bytes = (uint32_t)sizeof(nx_record) +
                   8u * kind_integers[e->type];
  for (uint32_t i = 0; i < n; i++) {
    if (s[i]->len > NX_MAX_STRING_BYTES) return 0;
    bytes += s[i]->len;
  }
  return round8(bytes);
}

uint32_t nx_encode(const nx_event *e, void *buffer, uint32_t buffer_bytes) {
  uint32_t need = nx_encoded_size(e);
  if (need == 0 || need > buffer_bytes) return need;
  assert(((uintptr_t)buffer & 7u) == 0);
  nx_record *r = buffer;
  memset(r, 0, sizeof *r);
  r->type = (uint32_t)e->type;
  int64_t ints[7];
  uint32_t ni = view_integers(e, ints);
  assert(ni == kind_integers[e->type]);
  memcpy(r->field, ints, 8u * ni);
  const nx_str *s[6];
  uint32_t ns = view_strings(e, s);
  char *p = (char *)(r->field + ni);
  for (uint32_t i = 0; i < ns; i++) {
    r->len[i] = (uint16_t)s[i]->len;
    if (s[i]->len > 0) memcpy(p, s[i]->ptr, s[i]->len);
    p += s[i]->len;
  }
  /* Zero the padding so equal events give equal bytes (checksums). */
  char *end = (char *)buffer + need;
  memset(p, 0, (size_t)(end - p));
  return need;
}

int nx_decode(const void *data, uint32_t size_bytes, nx_event *out) {
  if (data == NULL || out == NULL || size_bytes < sizeof(nx_record))
    return EINVAL;
  const nx_record *r = data;
  if (!kind_valid(r->type)) return EINVAL;
  uint32_t ni = kind_integers[r->type];
  uint32_t ns = kind_strings[r->type];
  uint64_t need = sizeof(nx_record) + 8u * ni;
  for (uint32_t i = 0; i < 6; i++) {
    if (i >= ns && r->len[i] != 0) return EINVAL;
    need += r->len[i];
  }
  if (need > size_bytes) return EINVAL;
  memset(out, 0, sizeof *out);
  out->type = (int)r->type;
  const char *p = (const char *)(r->field + ni);
  nx_str str[6];
  for (uint32_t i = 0; i < ns; i++) {
    str[i].ptr = p;
    str[i].len = r->len[i];
    p += r->len[i];
  }
  const int64_t *f = r->field;
  switch (r->type) {
  case NX_PERSON:
    out->u.person = (nx_person){.id = f[0], .date_time = f[1],
                                .name = str[0], .email_address = str[1],
                                .credit_card = str[2], .city = str[3],
                                .state = str[4], .extra = str[5]};
    break;
  case NX_AUCTION:
    out->u.auction = (nx_auction){
        .id = f[0], .initial_bid = f[1], .reserve = f[2],
        .date_time = f[3], .expires = f[4], .seller = f[5],
        .category = f[6], .item_name = str[0], .description = str[1],
        .extra = str[2]};
    break;
  default:
    out->u.bid = (nx_bid){.auction = f[0], .bidder = f[1], .price = f[2],
                          .date_time = f[3], .channel = str[0],
                          .url = str[1], .extra = str[2]};
    break;
  }
  return 0;
}

uint32_t nx_event_bytes(const nx_event *e) {
  if (e == NULL || e->type < 0 || !kind_valid((uint32_t)e->type)) return 0;
  const nx_str *s[6];
  uint32_t n = view_strings(e, s);
  uint32_t bytes = 8u * kind_integers[e->type];
  for (uint32_t i = 0; i < n; i++) bytes += s[i]->len;
  return bytes;
}
