/* test_nexmark_model.c — the Nexmark event model (nexmark/): the
 * record codec, the generator's rules and determinism, the generator
 * source (splits, failover), JSON lines (round trips, errors) and the
 * event-file source (replay, errors, refused restores). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nexmark.h"
#include "sluice.h"
#include "test_dirs.h"
#include "test_util.h"

/* ------------------------------------------------------------ helpers */

static nx_generator_config config_of(uint64_t events, uint64_t seed) {
  nx_generator_config c = {.events = events, .seed = seed};
  return c;
}

/* An 8-byte aligned record buffer. */
typedef struct record_buffer {
  uint64_t words[NX_MAX_RECORD_BYTES / 8 + 1];
} record_buffer;

/* nx_encode of event n's view: the bytes the source must emit. */
static uint32_t encode_event(const nx_generator_config *cfg, uint64_t n,
                             record_buffer *b) {
  nx_generated g;
  nx_generate(cfg, n, &g);
  uint32_t size = nx_encode(&g.event, b->words, sizeof b->words);
  cr_assert_gt(size, 0);
  cr_assert_leq(size, sizeof b->words);
  return size;
}

static int compare_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

static int64_t date_time_of(const nx_event *e) {
  return e->type == NX_PERSON    ? e->u.person.date_time
         : e->type == NX_AUCTION ? e->u.auction.date_time
                                 : e->u.bid.date_time;
}

static bool str_is(nx_str s, const char *text) {
  return s.len == strlen(text) && memcmp(s.ptr, text, s.len) == 0;
}

static bool all_in(nx_str s, const char *allowed) {
  for (uint32_t i = 0; i < s.len; i++)
    if (!s.ptr[i] || !strchr(allowed, s.ptr[i]))
      return false;
  return true;
}

static bool one_of(nx_str s, const char *const *list, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (str_is(s, list[i]))
      return true;
  return false;
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))
#define LOWER "abcdefghijklmnopqrstuvwxyz"

/* Same view: every integer and string equal (compared through the
 * records nx_encode builds). */
static void expect_same_event(const nx_event *a, const nx_event *b,
                              const char *what) {
  record_buffer x, y;
  uint32_t sx = nx_encode(a, x.words, sizeof x.words);
  uint32_t sy = nx_encode(b, y.words, sizeof y.words);
  cr_assert_eq(sx, sy, "%s: sizes %u and %u", what, sx, sy);
  cr_assert_eq(memcmp(x.words, y.words, sx), 0, "%s: bytes differ", what);
}

/* ------------------------------------------------------------ codec */

Test(model, codec_round_trip) {
  nx_generator_config cfg = config_of(5000, 3);
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    record_buffer b;
    uint32_t size = nx_encode(&g.event, b.words, sizeof b.words);
    cr_assert_eq(size, nx_encoded_size(&g.event));
    cr_assert_eq(size % 8, 0);
    nx_event back;
    cr_assert_eq(nx_decode(b.words, size, &back), 0);
    cr_assert_eq(back.type, g.event.type);
    cr_assert_eq(nx_event_bytes(&back), nx_event_bytes(&g.event));
    expect_same_event(&back, &g.event, "decode(encode(e))");
  }
  /* Strings at the limit encode; one byte more does not. */
  static char big[NX_MAX_STRING_BYTES + 1];
  memset(big, 'x', sizeof big);
  nx_event e = {.type = NX_BID};
  e.u.bid = (nx_bid){.auction = -5, .bidder = INT64_MAX, .price = INT64_MIN,
                     .channel = {big, NX_MAX_STRING_BYTES},
                     .url = {big, NX_MAX_STRING_BYTES},
                     .extra = {big, NX_MAX_STRING_BYTES}};
  record_buffer *b = malloc(sizeof *b);
  uint32_t size = nx_encode(&e, b->words, sizeof b->words);
  cr_assert_eq(size, 16 + 32 + 3 * NX_MAX_STRING_BYTES);
  nx_event back;
  cr_assert_eq(nx_decode(b->words, size, &back), 0);
  expect_same_event(&back, &e, "strings at the limit");
  e.u.bid.extra.len = NX_MAX_STRING_BYTES + 1;
  cr_assert_eq(nx_encode(&e, b->words, sizeof b->words), 0);
  /* A small buffer: the size needed, nothing else. */
  e.u.bid.extra.len = 3;
  uint32_t need = nx_encoded_size(&e);
  cr_assert_eq(nx_encode(&e, b->words, 16), need);
  free(b);
}

Test(model, malformed_records_are_refused) {
  nx_generator_config cfg = config_of(100, 3);
  record_buffer b;
  uint32_t size = encode_event(&cfg, 7, &b); /* a bid */
  nx_event e;
  cr_assert_eq(nx_decode(b.words, size, &e), 0);
  cr_assert_eq(nx_decode(b.words, size - 8, &e), EINVAL, "cut short");
  cr_assert_eq(nx_decode(b.words, 15, &e), EINVAL, "shorter than a head");
  cr_assert_eq(nx_decode(NULL, size, &e), EINVAL);
  nx_record *r = (nx_record *)b.words;
  r->type = 3;
  cr_assert_eq(nx_decode(b.words, size, &e), EINVAL, "unknown type");
  r->type = NX_BID;
  r->len[4] = 1;
  cr_assert_eq(nx_decode(b.words, size, &e), EINVAL, "a 4th bid string");
  r->len[4] = 0;
  r->len[2] = 60000;
  cr_assert_eq(nx_decode(b.words, size, &e), EINVAL, "length past the end");
  nx_event bad = {.type = 7};
  cr_assert_eq(nx_encoded_size(&bad), 0);
  cr_assert_eq(nx_encode(&bad, b.words, sizeof b.words), 0);
}

/* ------------------------------------------------------------ generator */

Test(generator, same_seed_same_bytes_other_seed_other_bytes) {
  nx_generator_config a = config_of(20000, 42), b = config_of(20000, 42);
  nx_generator_config c = config_of(20000, 43);
  uint64_t differ = 0;
  for (uint64_t n = 0; n < a.events; n++) {
    record_buffer x, y, z;
    uint32_t sx = encode_event(&a, n, &x), sy = encode_event(&b, n, &y);
    cr_assert_eq(sx, sy);
    cr_assert_eq(memcmp(x.words, y.words, sx), 0, "event %" PRIu64, n);
    uint32_t sz = encode_event(&c, n, &z);
    differ += sz != sx || memcmp(x.words, z.words, sx) != 0;
  }
  /* Every event has random strings: another seed changes all of them. */
  cr_assert_eq(differ, a.events, "%" PRIu64 " of %" PRIu64 " differ", differ,
               a.events);
}

Test(generator, proportions_are_1_3_46_in_every_50) {
  nx_generator_config cfg = config_of(5000, 1);
  uint64_t count[3] = {0};
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    cr_assert_eq(g.event.type, nx_event_type(n));
    count[g.event.type]++;
    if (n % 50 == 49) {
      cr_assert_eq(count[NX_PERSON], (n + 1) / 50);
      cr_assert_eq(count[NX_AUCTION], 3 * (n + 1) / 50);
      cr_assert_eq(count[NX_BID], 46 * (n + 1) / 50);
    }
  }
  cr_assert_eq(nx_event_type(0), NX_PERSON);
  for (uint64_t n = 1; n <= 3; n++)
    cr_assert_eq(nx_event_type(n + 50 * 1000003ull), NX_AUCTION);
  for (uint64_t n = 4; n < 50; n++)
    cr_assert_eq(nx_event_type(n + 50 * 7ull), NX_BID);
}

/* Beam-style sizes (nx_event_bytes): persons 200 and auctions 500 within
 * 5%.  Bids average ~108: their channel and url alone take ~72 bytes, so
 * the padding cannot bring every bid down to 100 (generator.c note 8). */
Test(generator, average_sizes) {
  nx_generator_config cfg = config_of(100000, 9);
  double sum[3] = {0};
  uint64_t count[3] = {0};
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    sum[g.event.type] += nx_event_bytes(&g.event);
    count[g.event.type]++;
  }
  double person = sum[0] / (double)count[0];
  double auction = sum[1] / (double)count[1];
  double bid = sum[2] / (double)count[2];
  cr_log_info("average sizes: person %.1f, auction %.1f, bid %.1f", person,
              auction, bid);
  cr_assert(person > 190 && person < 210, "person %.1f", person);
  cr_assert(auction > 475 && auction < 525, "auction %.1f", auction);
  cr_assert(bid > 100 && bid < 112, "bid %.1f", bid);
}

static const char *const first_names[] = {"Peter", "Paul",  "Luke",   "John",
                                          "Saul",  "Vicky", "Kate",   "Julie",
                                          "Sarah", "Deiter", "Walter"};
static const char *const last_names[] = {"Shultz", "Abrams",  "Spencer",
                                         "White",  "Bartels", "Walton",
                                         "Smith",  "Jones",   "Noris"};
static const char *const cities[] = {
    "Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland",
    "Bend",    "Redmond",     "Seattle",       "Kent",  "Cheyenne"};
static const char *const states[] = {"AZ", "CA", "ID", "OR", "WA", "WY"};
static const char *const hot_channels[] = {"Google", "Facebook", "Baidu",
                                           "Apple"};

static void check_person(const nx_person *p, uint64_t n) {
  cr_assert_eq(p->id, (int64_t)(n / 50 + NX_FIRST_PERSON_ID));
  const char *space = memchr(p->name.ptr, ' ', p->name.len);
  cr_assert(space, "name %.*s", (int)p->name.len, p->name.ptr);
  nx_str first = {p->name.ptr, (uint32_t)(space - p->name.ptr)};
  nx_str last = {space + 1, p->name.len - first.len - 1};
  cr_assert(one_of(first, first_names, COUNT(first_names)));
  cr_assert(one_of(last, last_names, COUNT(last_names)));
  const char *at = memchr(p->email_address.ptr, '@', p->email_address.len);
  cr_assert(at && p->email_address.len >= 5);
  cr_assert_eq(memcmp(p->email_address.ptr + p->email_address.len - 4, ".com",
                      4), 0);
  cr_assert_eq(p->credit_card.len, 19);
  for (uint32_t i = 0; i < 19; i++)
    cr_assert(i % 5 == 4 ? p->credit_card.ptr[i] == ' '
                         : (p->credit_card.ptr[i] >= '0' &&
                            p->credit_card.ptr[i] <= '9'));
  cr_assert(one_of(p->city, cities, COUNT(cities)));
  cr_assert(one_of(p->state, states, COUNT(states)));
  cr_assert(all_in(p->extra, LOWER));
}

static void check_auction(const nx_auction *a, uint64_t n) {
  int64_t people = (int64_t)(n / 50) + 1;
  cr_assert_eq(a->id, (int64_t)(3 * (n / 50) + n % 50 - 1) +
                          NX_FIRST_AUCTION_ID);
  cr_assert_geq(a->seller, NX_FIRST_PERSON_ID);
  cr_assert_lt(a->seller, NX_FIRST_PERSON_ID + people + 10, "seller lead");
  cr_assert(a->category >= 10 && a->category <= 14);
  cr_assert(a->initial_bid >= 100 && a->initial_bid <= 100000000);
  cr_assert_gt(a->reserve, a->initial_bid);
  cr_assert_leq(a->reserve - a->initial_bid, 100000000);
  /* 10M events/s: the horizon of 1666 events is 0 or 1 ms. */
  cr_assert(a->expires - a->date_time >= 1 && a->expires - a->date_time <= 2);
  cr_assert(a->item_name.len <= 19 && a->description.len <= 99);
  cr_assert(all_in(a->item_name, LOWER " ") && all_in(a->description,
                                                     LOWER " "));
  cr_assert(all_in(a->extra, LOWER));
}

static void check_bid(const nx_bid *b, uint64_t n) {
  int64_t people = (int64_t)(n / 50) + 1;
  int64_t auctions = (int64_t)(3 * (n / 50) + 3); /* all this epoch's */
  cr_assert_geq(b->auction, NX_FIRST_AUCTION_ID);
  cr_assert_lt(b->auction, NX_FIRST_AUCTION_ID + auctions + 10, "lead");
  cr_assert_geq(b->bidder, NX_FIRST_PERSON_ID);
  cr_assert_lt(b->bidder, NX_FIRST_PERSON_ID + people + 10, "bidder lead");
  cr_assert(b->price >= 100 && b->price <= 100000000, "price %" PRId64,
            b->price);
  bool hot = one_of(b->channel, hot_channels, COUNT(hot_channels));
  cr_assert(hot || (b->channel.len > 8 &&
                    memcmp(b->channel.ptr, "channel-", 8) == 0),
            "channel %.*s", (int)b->channel.len, b->channel.ptr);
  const char *head = "https://www.nexmark.com/";
  cr_assert(b->url.len > strlen(head) &&
            memcmp(b->url.ptr, head, strlen(head)) == 0);
  cr_assert(all_in(b->extra, LOWER));
}

/* Ids, prices, lengths and strings as Beam makes them, and the hot ids
 * about as often as Beam's ratios say. */
Test(generator, ids_prices_and_strings_follow_the_rules) {
  nx_generator_config cfg = config_of(200000, 5);
  uint64_t hot_seller = 0, hot_bidder = 0, hot_auction = 0, auctions = 0,
           bids = 0, hot_channel = 0;
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    const nx_event *e = &g.event;
    if (e->type == NX_PERSON) {
      check_person(&e->u.person, n);
    } else if (e->type == NX_AUCTION) {
      check_auction(&e->u.auction, n);
      auctions++;
      hot_seller += (e->u.auction.seller - NX_FIRST_PERSON_ID) % 100 == 0;
    } else {
      check_bid(&e->u.bid, n);
      bids++;
      hot_bidder += (e->u.bid.bidder - NX_FIRST_PERSON_ID) % 100 == 1;
      hot_auction += (e->u.bid.auction - NX_FIRST_AUCTION_ID) % 100 == 0;
      hot_channel += one_of(e->u.bid.channel, hot_channels, 4);
    }
  }
  /* Hot: 3/4 of sellers and bidders, 1/2 of auctions and channels (plus
   * the few random picks that land on a multiple of 100). */
  double s = (double)hot_seller / (double)auctions;
  double b = (double)hot_bidder / (double)bids;
  double a = (double)hot_auction / (double)bids;
  double c = (double)hot_channel / (double)bids;
  cr_log_info("hot sellers %.3f, bidders %.3f, auctions %.3f, channels %.3f",
              s, b, a, c);
  cr_assert(s > 0.74 && s < 0.77, "%f", s);
  cr_assert(b > 0.74 && b < 0.77, "%f", b);
  cr_assert(a > 0.49 && a < 0.52, "%f", a);
  cr_assert(c > 0.49 && c < 0.51, "%f", c);
}

Test(generator, date_time_without_and_with_disorder) {
  nx_generator_config cfg = config_of(30000, 11);
  cfg.events_per_second = 3000; /* 1000 / 3000: a fraction of a ms each */
  cfg.base_time_ms = 1000;
  int64_t previous = INT64_MIN;
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    int64_t t = date_time_of(&g.event);
    cr_assert_eq(t, 1000 + (int64_t)(n * 1000 / 3000), "event %" PRIu64, n);
    cr_assert_geq(t, previous);
    previous = t;
  }
  cfg.max_out_of_order_ms = 50;
  uint64_t moved = 0, out_of_order = 0;
  int64_t max = INT64_MIN;
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    int64_t t = date_time_of(&g.event);
    int64_t base = 1000 + (int64_t)(n * 1000 / 3000);
    cr_assert(t <= base && t >= base - 50, "event %" PRIu64 ": %" PRId64
              " against %" PRId64, n, t, base);
    if (max != INT64_MIN)
      cr_assert_geq(t, max - 50, "within the bound of the running maximum");
    moved += t != base;
    out_of_order += t < max;
    max = t > max ? t : max;
  }
  cr_assert_gt(moved, cfg.events * 9 / 10);
  cr_assert_gt(out_of_order, cfg.events / 2);
  /* The default base time and rate. */
  nx_generator_config d = config_of(100, 1);
  nx_generated g;
  nx_generate(&d, 99, &g);
  cr_assert_eq(date_time_of(&g.event), 1700000000000);
}

Test(generator, validate_refuses_bad_configs) {
  char err[200];
  nx_generator_config cfg = config_of(1000, 1);
  cr_assert_eq(nx_generator_validate(&cfg, err, sizeof err), 0);
  cr_assert_eq(nx_generator_validate(NULL, err, sizeof err), EINVAL);
  cfg.max_out_of_order_ms = -1;
  cr_assert_eq(nx_generator_validate(&cfg, err, sizeof err), EINVAL);
  cr_assert(strstr(err, "max_out_of_order_ms"), "%s", err);
  cfg = config_of(1000, 1);
  cfg.events_per_second = 1; /* 999 s after the base */
  cfg.base_time_ms = INT64_MAX - 100000;
  cr_assert_eq(nx_generator_validate(&cfg, err, sizeof err), EINVAL);
  cr_assert(strstr(err, "INT64_MAX"), "%s", err);
  cfg = config_of(1000, 1);
  cfg.base_time_ms = INT64_MIN + 5;
  cfg.max_out_of_order_ms = 5;
  cr_assert_eq(nx_generator_validate(&cfg, err, sizeof err), EINVAL);
  cfg = config_of(UINT64_MAX, 1);
  cr_assert_eq(nx_generator_validate(&cfg, err, sizeof err), EINVAL);
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *op;
  cr_assert_eq(nx_source_generator(job, "gen", 1, &cfg, NULL, &op), EINVAL);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ source */

/* A callback sink (parallelism 1) keeping a hash of every record, and
 * checking each record's timestamp is its date_time. */
typedef struct collector {
  uint64_t *hashes;
  uint64_t count;
  uint64_t capacity;
  uint64_t bad; /* undecodable, or stamped with another time */
} collector;

static int collect(void *user, int instance, const sl_record *rec) {
  (void)instance;
  collector *c = user;
  nx_event e;
  if (nx_decode(rec->data, rec->size_bytes, &e) != 0 ||
      rec->timestamp != date_time_of(&e) || c->count == c->capacity) {
    c->bad++;
    return 0;
  }
  c->hashes[c->count++] = sl_hash_bytes(rec->data, rec->size_bytes);
  return 0;
}

/* Sorted hashes of nx_encode(nx_generate(n)), n < cfg->events. */
static uint64_t *expected_hashes(const nx_generator_config *cfg) {
  uint64_t *h = malloc(cfg->events * sizeof *h);
  cr_assert(h);
  for (uint64_t n = 0; n < cfg->events; n++) {
    record_buffer b;
    uint32_t size = encode_event(cfg, n, &b);
    h[n] = sl_hash_bytes(b.words, size);
  }
  qsort(h, cfg->events, sizeof *h, compare_u64);
  return h;
}

static int run_guarded(sl_job *job, const char *what) {
  int rc = sl_job_start(job);
  cr_assert_eq(rc, 0, "%s: %s", sl_strerror(rc), sl_job_error(job));
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, job, 120, what), 0);
  rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "%s hung", what);
  return rc;
}

/* The source at P = 1 and P = 4 emits exactly nx_generate's events (the
 * same bytes as nx_encode of each view), whatever the split. */
Test(source, p1_and_p4_emit_exactly_the_generated_events) {
  nx_generator_config cfg = config_of(sl_test_scaled(100000, 20000) + 777, 8);
  cfg.max_out_of_order_ms = 3;
  uint64_t *want = expected_hashes(&cfg);
  int parallelisms[] = {1, 4};
  for (int k = 0; k < 2; k++) {
    collector c = {.capacity = cfg.events + 1};
    c.hashes = malloc(c.capacity * sizeof *c.hashes);
    sl_job *job;
    cr_assert_eq(sl_job_create(NULL, &job), 0);
    sl_op *src, *sink;
    nx_source_config sc = {.deterministic_watermarks = 1};
    cr_assert_eq(nx_source_generator(job, "gen", parallelisms[k], &cfg, &sc,
                                     &src), 0);
    cr_assert_eq(sl_sink_callback(job, "sink", src, 1, collect, &c, &sink),
                 0);
    int rc = run_guarded(job, "generator job");
    cr_assert_eq(rc, 0, "%s", sl_job_error(job));
    sl_job_destroy(job);
    cr_assert_eq(c.bad, 0);
    cr_assert_eq(c.count, cfg.events, "P=%d: %" PRIu64 " records",
                 parallelisms[k], c.count);
    qsort(c.hashes, c.count, sizeof *c.hashes, compare_u64);
    cr_assert_eq(memcmp(c.hashes, want, cfg.events * sizeof *want), 0,
                 "P=%d: another multiset of records", parallelisms[k]);
    free(c.hashes);
  }
  free(want);
}

/* A callback sink (parallelism 1) that fails once, on the first record
 * after a checkpoint completed that covers some but not all of the input
 * (so the restore is from the middle, whatever the timing).  It learns
 * what a checkpoint covers from the records it saw before its barrier. */
typedef struct trigger {
  uint64_t total;      /* records in the whole input */
  uint64_t received;   /* in this attempt, since the restored position */
  uint64_t at_snapshot[64]; /* records before barrier id (id % 64) */
  uint64_t covered;    /* by the newest completed checkpoint */
  bool fired;
} trigger;

static int trigger_record(void *user, int instance, const sl_record *rec) {
  (void)instance;
  (void)rec;
  trigger *t = user;
  t->received++;
  if (!t->fired && t->covered > 0 && t->covered < t->total) {
    t->fired = true;
    return -7;
  }
  return 0;
}

static int trigger_checkpoint(void *user, int instance, int event,
                              uint64_t id) {
  (void)instance;
  trigger *t = user;
  if (id == UINT64_MAX)
    return 0; /* the final checkpoint covers everything */
  if (event == SL_CALLBACK_SNAPSHOT)
    t->at_snapshot[id % 64] = t->received;
  else if (event == SL_CALLBACK_COMPLETE)
    t->covered = t->at_snapshot[id % 64];
  else if (event == SL_CALLBACK_RESTORE)
    t->received = t->at_snapshot[id % 64];
  return 0;
}

static int format_json(void *user, const sl_record *in, char *buffer,
                       uint32_t buffer_bytes) {
  (void)user;
  nx_event e;
  if (nx_decode(in->data, in->size_bytes, &e) != 0)
    return -1;
  size_t n = nx_json_write(&e, buffer, buffer_bytes);
  return (int)(n <= buffer_bytes ? n - 1 : n); /* without the newline */
}

/* A text and its lines. */
typedef struct lines {
  char *text;
  size_t bytes;
  size_t capacity; /* of text; grows by doubling (realloc copies under ASan) */
  char **line;
  size_t count;
} lines;

static void lines_split(lines *l) {
  size_t cap = 16;
  l->line = malloc(cap * sizeof *l->line);
  l->count = 0;
  for (char *p = l->text; p < l->text + l->bytes;) {
    char *nl = memchr(p, '\n', (size_t)(l->text + l->bytes - p));
    cr_assert(nl, "a line without its newline");
    *nl = 0;
    if (l->count == cap)
      l->line = realloc(l->line, (cap *= 2) * sizeof *l->line);
    l->line[l->count++] = p;
    p = nl + 1;
  }
}

static void lines_add(lines *l, const char *data, size_t bytes) {
  if (l->bytes + bytes + 1 > l->capacity) {
    size_t want = l->capacity ? l->capacity : 4096;
    while (want < l->bytes + bytes + 1)
      want *= 2;
    l->text = realloc(l->text, want);
    cr_assert(l->text, "lines: out of memory at %zu bytes", want);
    l->capacity = want;
  }
  memcpy(l->text + l->bytes, data, bytes);
  l->bytes += bytes;
  l->text[l->bytes] = 0;
}

static void lines_free(lines *l) {
  free(l->text);
  free(l->line);
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The committed part files of a file sink's directory, in name order. */
static lines committed(const char *dir, int *pending) {
  DIR *d = opendir(dir);
  cr_assert(d, "opendir %s", dir);
  size_t count = 0, capacity = 256;
  char **names = malloc(capacity * sizeof *names);
  *pending = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".part-", 6) == 0)
      (*pending)++;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    if (count == capacity)
      names = realloc(names, (capacity *= 2) * sizeof *names);
    cr_assert(names);
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, count, sizeof names[0], compare_names);
  lines all = {0};
  lines_add(&all, "", 0);
  for (size_t i = 0; i < count; i++) {
    char *path = sl_test_path_in(dir, names[i]);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
      lines_add(&all, chunk, got);
    fclose(f);
    free(path);
    free(names[i]);
  }
  free(names);
  lines_split(&all);
  return all;
}

static int compare_strings(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The JSON lines of every event of cfg (no newlines), as one text. */
static lines expected_json(const nx_generator_config *cfg) {
  lines l = {0};
  lines_add(&l, "", 0);
  char line[8192];
  for (uint64_t n = 0; n < cfg->events; n++) {
    nx_generated g;
    nx_generate(cfg, n, &g);
    size_t len = nx_json_write(&g.event, line, sizeof line);
    cr_assert_lt(len, sizeof line);
    lines_add(&l, line, len);
  }
  lines_split(&l);
  return l;
}

/* A job checkpointing every 10 ms into state_dir (resuming what is
 * there), with `restarts` fixed-delay restarts and faults injected. */
static sl_job *failover_job(const char *state_dir, int restarts,
                            const char *faults) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = 10;
  config.checkpoint.no_sync = 1;
  config.checkpoint.store_policy = SL_STORE_RESUME;
  config.ring_bytes = 64 * 1024; /* barriers queue behind less */
  config.faults = faults;
  if (restarts) {
    config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
    config.restart.attempts = (uint32_t)restarts;
    config.restart.delay_ms = 0;
  }
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  return job;
}

/* Generator (P = 2, paced) -> exactly-once file sink, and a trigger sink
 * that fails the job once mid-run: after the in-process restart the
 * committed output is every event exactly once. */
Test(source, failover_delivers_each_event_exactly_once) {
  nx_generator_config cfg = config_of(sl_test_scaled(40000, 8000), 21);
  cfg.max_out_of_order_ms = 20;
  char *state = sl_test_temp_dir("nxgen");
  char *out = sl_test_temp_dir("nxgen-out");
  sl_job *job = failover_job(state, 2, NULL);
  /* ~0.2 s per instance: checkpoints complete mid-run. */
  nx_source_config sc = {.events_per_second_limit = cfg.events * 5 / 2};
  sl_op *src, *sink, *trig;
  cr_assert_eq(nx_source_generator(job, "gen", 2, &cfg, &sc, &src), 0);
  sl_file_sink_config fc = {.dir = out, .exactly_once = 1,
                            .format = format_json, .suffix = ".jsonl"};
  cr_assert_eq(sl_sink_file(job, "sink", src, 1, &fc, &sink), 0);
  trigger t = {.total = cfg.events};
  cr_assert_eq(sl_sink_callback(job, "trigger", src, 1, trigger_record, &t,
                                &trig), 0);
  cr_assert_eq(sl_sink_callback_checkpoints(trig, trigger_checkpoint), 0);
  int rc = run_guarded(job, "generator failover");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert(t.fired, "no checkpoint completed mid-run");
  cr_assert_eq(sl_job_restarts(job), 1);
  sl_recovery_stats rs;
  cr_assert_eq(sl_job_recovery_stats(job, 0, &rs), 0);
  cr_assert_gt(rs.restored_from, 0, "restored from the middle");
  sl_job_destroy(job);
  int pending;
  lines got = committed(out, &pending);
  lines want = expected_json(&cfg);
  cr_assert_eq(pending, 0);
  cr_assert_eq(got.count, want.count, "%zu lines, expected %zu", got.count,
               want.count);
  qsort(got.line, got.count, sizeof *got.line, compare_strings);
  qsort(want.line, want.count, sizeof *want.line, compare_strings);
  for (size_t i = 0; i < got.count; i++)
    cr_assert_str_eq(got.line[i], want.line[i], "sorted line %zu", i);
  lines_free(&got);
  lines_free(&want);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}

/* Run a small generator job to its end in state (it keeps its final
 * checkpoint), then resume it with another seed: refused. */
Test(source, restore_refuses_another_configuration) {
  char *state = sl_test_temp_dir("nxgen-conf");
  for (int attempt = 0; attempt < 2; attempt++) {
    nx_generator_config cfg = config_of(3000, 100 + (uint64_t)attempt);
    sl_job *job = failover_job(state, 0, NULL);
    collector c = {.capacity = cfg.events + 1};
    c.hashes = malloc(c.capacity * sizeof *c.hashes);
    sl_op *src, *sink;
    cr_assert_eq(nx_source_generator(job, "gen", 1, &cfg, NULL, &src), 0);
    cr_assert_eq(sl_sink_callback(job, "sink", src, 1, collect, &c, &sink),
                 0);
    int rc = run_guarded(job, "generator config change");
    if (attempt == 0) {
      cr_assert_eq(rc, 0, "%s", sl_job_error(job));
      cr_assert_eq(c.count, cfg.events);
    } else {
      cr_assert_neq(rc, 0);
      cr_assert(strstr(sl_job_error(job), "seed 100") &&
                    strstr(sl_job_error(job), "seed 101"),
                "%s", sl_job_error(job));
    }
    free(c.hashes);
    sl_job_destroy(job);
  }
  sl_test_remove_tree(state);
}

/* ------------------------------------------------------------ JSON */

static void expect_json_round_trip(const nx_event *e, const char *what) {
  static char line[8 * NX_MAX_RECORD_BYTES];
  static char storage[sizeof line];
  size_t len = nx_json_write(e, line, sizeof line);
  cr_assert(len > 0 && len < sizeof line, "%s", what);
  cr_assert_eq(line[len - 1], '\n');
  cr_assert_eq(line[len], 0, "a NUL after it when there is room");
  cr_assert_null(memchr(line, '\n', len - 1), "%s: one line", what);
  nx_event back;
  char err[256];
  int rc = nx_json_parse(line, len, &back, storage, sizeof storage, err,
                         sizeof err);
  cr_assert_eq(rc, 0, "%s: %s in %.200s", what, err, line);
  expect_same_event(&back, e, what);
}

Test(json, round_trip_of_generated_events) {
  nx_generator_config cfg = config_of(sl_test_scaled(30000, 5000), 77);
  cfg.max_out_of_order_ms = 100;
  for (uint64_t n = 0; n < cfg.events; n++) {
    nx_generated g;
    nx_generate(&cfg, n, &g);
    expect_json_round_trip(&g.event, "generated");
  }
  nx_generated g;
  nx_generate(&cfg, 0, &g);
  char line[2048];
  size_t len = nx_json_write(&g.event, line, sizeof line);
  const char *head = "{\"event_type\":0,\"person\":{\"id\":1000,\"name\":\"";
  cr_assert_eq(strncmp(line, head, strlen(head)), 0, "%s", line);
  cr_assert_str_eq(line + len - 4, "\"}}\n", "%s", line);
}

/* Strings with quotes, backslashes, control characters, NULs and UTF-8;
 * empty strings; strings at the limit.  Bytes that are not UTF-8 are
 * written as they are but refused when read back (json.c note 2; the
 * whole table is in test_time_extremes.c). */
Test(json, tricky_strings_round_trip) {
  static const char tricky[][48] = {
      "", "\"", "\\", "\\\"", "a\"b\\c", "/slash/", "tab\there",
      "line\nbreak\r\n", "\b\f", "\x01\x02\x1f\x7f", "caf\xc3\xa9",
      "\xe2\x82\xac \xf0\x9f\x98\x80", "{\"a\":1}",
      "\\u0041", "]},{"};
  size_t count = COUNT(tricky);
  for (size_t i = 0; i < count; i++) {
    nx_str s = {tricky[i], (uint32_t)strlen(tricky[i])};
    nx_event e = {.type = NX_PERSON};
    e.u.person = (nx_person){.id = -1, .name = s, .email_address = s,
                             .credit_card = s, .city = s, .state = s,
                             .date_time = SL_TIME_MIN_VALID, .extra = s};
    expect_json_round_trip(&e, tricky[i]);
  }
  {
    static const char not_utf8[] = "\xff\xfe not utf-8";
    nx_event e = {.type = NX_PERSON};
    nx_str s = {not_utf8, (uint32_t)strlen(not_utf8)};
    e.u.person = (nx_person){.name = s, .email_address = s,
                             .credit_card = s, .city = s, .state = s,
                             .extra = s};
    static char line[8 * NX_MAX_RECORD_BYTES], storage[sizeof line];
    char err[256];
    size_t len = nx_json_write(&e, line, sizeof line);
    nx_event back;
    cr_assert_eq(nx_json_parse(line, len, &back, storage, sizeof storage, err,
                               sizeof err),
                 EINVAL);
    cr_assert(strstr(err, "field \"name\": invalid UTF-8 at byte"), "%s",
              err);
  }
  /* NUL bytes inside a string. */
  static const char nul[] = {'a', 0, 'b', 0};
  nx_event e = {.type = NX_AUCTION};
  e.u.auction = (nx_auction){.id = INT64_MAX, .item_name = {nul, 4},
                             .description = {nul, 1}, .extra = {nul, 0},
                             .initial_bid = INT64_MIN, .expires = -1};
  expect_json_round_trip(&e, "NULs");
  /* At the limit, every byte escaped six times over. */
  static char big[NX_MAX_STRING_BYTES];
  memset(big, 0x01, sizeof big);
  e = (nx_event){.type = NX_BID};
  e.u.bid = (nx_bid){.channel = {big, NX_MAX_STRING_BYTES},
                     .url = {big, NX_MAX_STRING_BYTES},
                     .extra = {big, NX_MAX_STRING_BYTES}, .price = 1};
  expect_json_round_trip(&e, "at the limit");
}

Test(json, escapes_parse_to_utf8) {
  const char *line =
      "{ \"bid\" : {\"auction\":1, \"bidder\" :-2,\"price\":0,"
      "\"channel\":\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\","
      "\"url\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\",\"date_time\":5,"
      "\"ext\\u0072a\":\"\"} , \"event_type\" : 2 }\r\n";
  char storage[512], err[256];
  nx_event e;
  int rc = nx_json_parse(line, strlen(line), &e, storage, sizeof storage, err,
                         sizeof err);
  cr_assert_eq(rc, 0, "%s", err);
  cr_assert_eq(e.type, NX_BID);
  cr_assert_eq(e.u.bid.bidder, -2);
  cr_assert(str_is(e.u.bid.channel, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  cr_assert(str_is(e.u.bid.url, "\"\\/\b\f\n\r\t"));
  cr_assert_eq(e.u.bid.extra.len, 0);
  cr_assert_eq(e.u.bid.date_time, 5);
}

/* A complete bid object. */
#define BID_BODY                                                               \
  "{\"auction\":1,\"bidder\":2,\"price\":3,\"channel\":\"c\",\"url\":\"u\","   \
  "\"date_time\":4,\"extra\":\"\"}"

/* Each malformed line and the words its error must contain. */
static const struct {
  const char *line;
  const char *error;
} malformed[] = {
    {"", "not a JSON object"},
    {"[1,2]", "not a JSON object"},
    {"\"person\"", "not a JSON object"},
    {"{}", "missing field \"event_type\""},
    {"{\"event_type\":0}", "missing the event object"},
    {"{\"event_type\":7,\"bid\":" BID_BODY "}", "unknown event_type 7"},
    {"{\"bid\":" BID_BODY ",\"event_type\":-1}", "unknown event_type -1"},
    {"{\"event_type\":1,\"bid\":" BID_BODY "}",
     "event_type 1 does not match the object \"bid\""},
    {"{\"event_type\":2,\"person\":{\"id\":1,\"name\":\"a\",\"email_address\""
     ":\"b\",\"credit_card\":\"c\",\"city\":\"d\",\"state\":\"e\","
     "\"date_time\":1,\"extra\":\"\"}}",
     "event_type 2 does not match the object \"person\""},
    {"{\"event_type\":\"2\",\"bid\":{}}", "field \"event_type\": expected an "
                                          "integer"},
    {"{\"event_type\":2,\"bid\":[]}", "field \"bid\": expected an object"},
    {"{\"event_type\":2,\"bid\":{\"auction\":1}}", "missing field "
                                                  "\"bidder\" in \"bid\""},
    {"{\"event_type\":2,\"bid\":{\"price\":\"12\"}}", "field \"price\": "
                                                     "expected an integer"},
    {"{\"event_type\":2,\"bid\":{\"price\":1.5}}", "field \"price\": expected "
                                                  "an integer"},
    {"{\"event_type\":2,\"bid\":{\"price\":1e3}}", "field \"price\": expected "
                                                  "an integer"},
    {"{\"event_type\":2,\"bid\":{\"price\":null}}", "field \"price\": "
                                                   "expected an integer"},
    {"{\"event_type\":2,\"bid\":{\"price\":9223372036854775808}}",
     "field \"price\": integer out of range"},
    {"{\"event_type\":2,\"bid\":{\"price\":-9223372036854775809}}",
     "field \"price\": integer out of range"},
    {"{\"event_type\":2,\"bid\":{\"price\":012}}", "field \"price\": invalid "
                                                  "number"},
    {"{\"event_type\":2,\"bid\":{\"channel\":5}}", "field \"channel\": "
                                                  "expected a string"},
    {"{\"event_type\":2,\"bid\":{\"channel\":\"ab}}", "field \"channel\": "
                                                     "unterminated string"},
    {"{\"event_type\":2,\"bid\":{\"channel\":\"a\\qb\"}}", "field "
                                                          "\"channel\": "
                                                          "invalid escape"},
    {"{\"event_type\":2,\"bid\":{\"channel\":\"\\ud800\"}}",
     "unpaired surrogate"},
    {"{\"event_type\":2,\"bid\":{\"channel\":\"\\u12G4\"}}", "invalid \\u "
                                                            "escape"},
    {"{\"event_type\":2,\"bid\":{\"channel\":\"a\tb\"}}", "a control "
                                                         "character"},
    {"{\"event_type\":2,\"bid\":{\"color\":1}}", "unknown field \"color\" in "
                                                "\"bid\""},
    {"{\"event_type\":2,\"colour\":1}", "unknown field \"colour\""},
    {"{\"event_type\":2,\"event_type\":2}", "duplicate field \"event_type\""},
    {"{\"event_type\":2,\"bid\":{\"price\":1,\"price\":2}}", "duplicate "
                                                            "field \"price\""},
    {"{\"event_type\":2,\"bid\":" BID_BODY ",\"person\":{}}",
     "more than one event object (\"bid\" and \"person\")"},
    {"{\"event_type\":2 \"bid\":{}}", "expected ',' or '}'"},
    {"{\"event_type\" 2}", "expected ':'"},
    {"{event_type:2}", "expected a field name"},
    {"{\"event_type\":2,}", "expected a field name"},
    {"{\"event_type\":2", "the line ends early"},
    {"{\"event_type\":2,\"bid\":{\"auction\":1,\"bidder\":2,\"price\":3,"
     "\"channel\":\"c\",\"url\":\"u\",\"date_time\":4,\"extra\":\"\"}} x",
     "trailing characters after the object"},
    {"{\"event_type\":2,\"bid\":{\"auction\":1,\"bidder\":2,\"price\":3,"
     "\"channel\":\"c\",\"url\":\"u\",\"date_time\":4,\"extra\":\"\"}}{}",
     "trailing characters after the object"},
};

Test(json, malformed_lines_give_clear_errors) {
  char storage[4096], err[256];
  for (size_t i = 0; i < COUNT(malformed); i++) {
    nx_event e;
    int rc = nx_json_parse(malformed[i].line, strlen(malformed[i].line), &e,
                           storage, sizeof storage, err, sizeof err);
    cr_assert_eq(rc, EINVAL, "accepted: %s", malformed[i].line);
    cr_assert(strstr(err, malformed[i].error), "%s\n  gave: %s\n  want: %s",
              malformed[i].line, err, malformed[i].error);
  }
  /* A string over the limit. */
  size_t big = NX_MAX_STRING_BYTES + 200;
  char *line = malloc(big);
  char *store = malloc(big);
  int n = snprintf(line, big, "{\"event_type\":2,\"bid\":{\"extra\":\"");
  memset(line + n, 'x', NX_MAX_STRING_BYTES + 1);
  strcpy(line + n + NX_MAX_STRING_BYTES + 1, "\"}}");
  nx_event e;
  cr_assert_eq(nx_json_parse(line, strlen(line), &e, store, big, err,
                             sizeof err), EINVAL);
  cr_assert(strstr(err, "field \"extra\": a string of 4097 bytes, longer than "
                        "4096"), "%s", err);
  free(line);
  free(store);
}

Test(json, short_buffer_gives_the_length_needed) {
  nx_generator_config cfg = config_of(10, 4);
  nx_generated g;
  nx_generate(&cfg, 1, &g);
  char full[4096], small[16];
  size_t need = nx_json_write(&g.event, full, sizeof full);
  cr_assert_gt(need, sizeof small);
  cr_assert_eq(nx_json_write(&g.event, small, sizeof small), need);
  cr_assert_eq(nx_json_write(&g.event, NULL, 0), need);
  char *exact = malloc(need);
  cr_assert_eq(nx_json_write(&g.event, exact, need), need);
  cr_assert_eq(memcmp(exact, full, need), 0);
  free(exact);
}

/* ------------------------------------------------------------ files */

static void write_text(const char *path, const char *text, size_t bytes) {
  FILE *f = fopen(path, "wb");
  cr_assert(f, "%s", path);
  cr_assert_eq(fwrite(text, 1, bytes, f), bytes);
  cr_assert_eq(fclose(f), 0);
}

/* Events [from, to) of cfg as an event file, with a blank line and an
 * empty one in the middle and CRLF on some lines. */
static void write_events(const char *path, const nx_generator_config *cfg,
                         uint64_t from, uint64_t to) {
  lines l = {0};
  lines_add(&l, "", 0);
  char line[8192];
  for (uint64_t n = from; n < to; n++) {
    nx_generated g;
    nx_generate(cfg, n, &g);
    size_t len = nx_json_write(&g.event, line, sizeof line);
    if (n % 7 == 0) { /* CRLF */
      line[len - 1] = '\r';
      line[len++] = '\n';
    }
    lines_add(&l, line, len);
    if (n == (from + to) / 2)
      lines_add(&l, "\n  \t \n", 6);
  }
  write_text(path, l.text, l.bytes);
  free(l.text);
}

/* Event files -> exactly-once file sink, and a trigger failing the job
 * once mid-run: the committed output is the events in file order. */
Test(file_source, two_files_replay_exactly_across_a_failover) {
  nx_generator_config cfg = config_of(sl_test_scaled(20000, 4000), 31);
  char *dir = sl_test_temp_dir("nxfile");
  char *state = sl_test_path_in(dir, "state");
  char *out = sl_test_path_in(dir, "out");
  char *a = sl_test_path_in(dir, "a.jsonl"), *b = sl_test_path_in(dir, "b.jsonl");
  write_events(a, &cfg, 0, cfg.events / 3);
  write_events(b, &cfg, cfg.events / 3, cfg.events);
  /* A slow trigger sink: checkpoints land mid-run. */
  sl_job *job = failover_job(state, 2, "slow:op=trigger,delay_us=20");
  const char *paths[] = {a, b};
  sl_op *src, *sink, *trig;
  cr_assert_eq(nx_source_file(job, "events", paths, 2, NULL, &src), 0);
  sl_file_sink_config fc = {.dir = out, .exactly_once = 1,
                            .format = format_json, .suffix = ".jsonl"};
  cr_assert_eq(sl_sink_file(job, "sink", src, 1, &fc, &sink), 0);
  trigger t = {.total = cfg.events};
  cr_assert_eq(sl_sink_callback(job, "trigger", src, 1, trigger_record, &t,
                                &trig), 0);
  cr_assert_eq(sl_sink_callback_checkpoints(trig, trigger_checkpoint), 0);
  int rc = run_guarded(job, "event-file failover");
  cr_assert_eq(rc, 0, "%s", sl_job_error(job));
  cr_assert(t.fired, "no checkpoint completed mid-run");
  cr_assert_eq(sl_job_restarts(job), 1);
  sl_recovery_stats rs;
  cr_assert_eq(sl_job_recovery_stats(job, 0, &rs), 0);
  cr_assert_gt(rs.restored_from, 0);
  sl_job_destroy(job);
  int pending;
  lines got = committed(out, &pending);
  lines want = expected_json(&cfg);
  cr_assert_eq(pending, 0);
  cr_assert_eq(got.count, want.count, "%zu lines, expected %zu", got.count,
               want.count);
  for (size_t i = 0; i < got.count; i++) /* in file order */
    cr_assert_str_eq(got.line[i], want.line[i], "line %zu", i);
  lines_free(&got);
  lines_free(&want);
  free(a);
  free(b);
  free(state);
  free(out);
  sl_test_remove_tree(dir);
}

Test(file_source, a_bad_line_fails_the_job_naming_file_and_line) {
  char *dir = sl_test_temp_dir("nxfile-bad");
  char *a = sl_test_path_in(dir, "a.jsonl"), *b = sl_test_path_in(dir, "b.jsonl");
  nx_generator_config cfg = config_of(100, 1);
  write_events(a, &cfg, 0, 60);
  const char *bad =
      "{\"event_type\":2,\"bid\":{\"auction\":1,\"bidder\":2,\"price\":3,"
      "\"channel\":\"c\",\"url\":\"u\",\"date_time\":4,\"extra\":\"\"}}\n"
      "\n"
      "{\"event_type\":2,\"bid\":{\"auction\":1,\"bidder\":2,\"price\":\"3\","
      "\"channel\":\"c\",\"url\":\"u\",\"date_time\":4,\"extra\":\"\"}}\n";
  write_text(b, bad, strlen(bad));
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  const char *paths[] = {a, b};
  collector c = {.capacity = 1000};
  c.hashes = malloc(c.capacity * sizeof *c.hashes);
  sl_op *src, *sink;
  cr_assert_eq(nx_source_file(job, "events", paths, 2, NULL, &src), 0);
  cr_assert_eq(sl_sink_callback(job, "sink", src, 1, collect, &c, &sink), 0);
  int rc = run_guarded(job, "bad event file");
  cr_assert_eq(rc, -EINVAL, "%d: %s", rc, sl_strerror(rc)); /* the parser's */
  char want[4200];
  snprintf(want, sizeof want, "%s line 3: field \"price\": expected an "
           "integer", b);
  cr_assert(strstr(sl_job_error(job), want), "%s", sl_job_error(job));
  sl_job_destroy(job);
  free(c.hashes);
  /* Builder errors. */
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  cr_assert_eq(nx_source_file(job, "events", paths, 0, NULL, &src), EINVAL);
  const char *none[] = {NULL};
  cr_assert_eq(nx_source_file(job, "events", none, 1, NULL, &src), EINVAL);
  sl_job_destroy(job);
  free(a);
  free(b);
  sl_test_remove_tree(dir);
}

/* One run that fails mid-file after a checkpoint, then resumes: with
 * another file list (refused), then with the file cut short (refused). */
Test(file_source, restore_refuses_another_list_or_a_truncated_file) {
  nx_generator_config cfg = config_of(sl_test_scaled(10000, 3000), 41);
  char *dir = sl_test_temp_dir("nxfile-restore");
  char *state = sl_test_path_in(dir, "state");
  char *a = sl_test_path_in(dir, "a.jsonl"), *b = sl_test_path_in(dir, "b.jsonl");
  write_events(a, &cfg, 0, cfg.events);
  write_text(b, "", 0);
  for (int run = 0; run < 3; run++) {
    sl_job *job = failover_job(state, 0, run == 0 ? "slow:op=trigger,"
                                                    "delay_us=50"
                                                  : NULL);
    const char *one[] = {a}, *two[] = {a, b};
    sl_op *src, *trig;
    cr_assert_eq(nx_source_file(job, "events", run == 1 ? two : one,
                                run == 1 ? 2 : 1, NULL, &src), 0);
    trigger t = {.total = cfg.events};
    cr_assert_eq(sl_sink_callback(job, "trigger", src, 1, trigger_record, &t,
                                  &trig), 0);
    cr_assert_eq(sl_sink_callback_checkpoints(trig, trigger_checkpoint), 0);
    if (run == 2)
      cr_assert_eq(truncate(a, 10), 0);
    int rc = run_guarded(job, "event-file restore");
    const char *error = sl_job_error(job);
    if (run == 0) {
      cr_assert_eq(rc, -7, "%s", error); /* trigger_record's return */
      cr_assert(t.fired, "no checkpoint completed mid-file");
    } else if (run == 1) {
      cr_assert_neq(rc, 0);
      cr_assert(strstr(error, "another list of event files"), "%s", error);
    } else {
      cr_assert_neq(rc, 0);
      cr_assert(strstr(error, "was truncated below the checkpointed "
                           "position"), "%s", error);
    }
    sl_job_destroy(job);
  }
  free(a);
  free(b);
  free(state);
  sl_test_remove_tree(dir);
}
