/* generator.c — the Nexmark event generator: event n as a pure function of
 * (config, n), and the generator source (nexmark.h has the contract).
 *
 * NOTES ON THE DESIGN
 *
 * 1. Rules.  The kinds, ids, prices, lengths and sizes follow the
 *    generator of the nexmark/nexmark Flink runner (itself Apache Beam's
 *    NexmarkGenerator) with its default configuration: 1 person, 3
 *    auctions, 46 bids in every 50 event numbers; ids from
 *    lastBase0PersonId / lastBase0AuctionId; hot sellers (ratio 4), hot
 *    bidders (4) and hot auctions (2), each rounded down to a multiple of
 *    100 (+1 for bidders); other ids among the last 1000 people or 100
 *    auctions plus a lead of 10; log-uniform prices; auction lengths from
 *    the time 100 auctions (1666 events) ahead; `extra` padding by
 *    nextExtra.  Where this file departs from it, note 8 says so and why.
 * 2. Randomness.  Event n draws from its own small generator (wyrand),
 *    seeded with a splitmix64 finaliser of (seed, n): no state is carried
 *    between events, so an instance can start anywhere (a restore is a
 *    seek), any split gives the same events, and nx_generate() is the
 *    test's reference.  Beam seeds java.util.Random with the event id for
 *    the same reason.
 * 3. Speed.  One writer, gen_record(), builds the nx_record in place (no
 *    view, no nx_encode), with the same bytes as nx_encode of the same
 *    event (the tests check).  Random letters come 8 per 64-bit draw
 *    (SWAR: each byte b gives 'a' + b * 26 / 256); Beam's nextString
 *    characters take a second draw for where the spaces go.  Prices use
 *    a polynomial instead of libm's exp (next_price).  Writers may store
 *    up to 15 bytes past a string's end (whole 8-byte words, fixed-size
 *    copies of short strings): every buffer has GEN_SLACK_BYTES to spare,
 *    the next string overwrites them and the final padding is zeroed.
 *    Integer reductions use multiply-shift, not division.  About 27M
 *    events/s on one core (release build).
 * 4. Time.  date_time(n) = base + n * 1000 / rate, minus a delay drawn
 *    from the event's generator when disorder is on.  The source keeps n
 *    * 1000 as quotient and remainder and steps them (no division per
 *    event); nx_generate divides once.  The auction horizon (time of the
 *    event 1666 numbers ahead minus this one's, both without delay) comes
 *    from the same remainder.
 * 5. Channels.  A bid's channel is one of four hot ones (half the bids)
 *    or "channel-N", N < 10000, as in nexmark/nexmark, which draws each
 *    channel's url when first used and caches it for the process.  Here
 *    the urls come from a fixed stream per channel (a hash of N and a
 *    constant) into a 320 KB table filled once per process
 *    (channel_table): the same in every process and run.
 * 6. Source.  Instance k of P emits blocks of NX_SPLIT_BLOCK numbers: k,
 *    k + P, ...  Its position is the next event number; a snapshot saves
 *    it with the configuration and P, and a restore refuses a checkpoint
 *    of another configuration or parallelism (it would resume silently
 *    into other events).  Each next() emits at most the rest of one block.
 * 7. Rate limit (events_per_second_limit; operators/rate.h, shared with
 *    operators/generator.c): a schedule anchored at the first next(); when
 *    nothing is due the instance sleeps until the next event is, at most
 *    1 ms per call, and returns, so stops and barriers are never held up;
 *    it never spins.  After a stall at most one block is due at once.
 * 8. Departures from nexmark/nexmark, and why:
 *    - PRNG per event (note 2), not one java.util.Random per generator.
 *    - nextString characters: a space (or '_') with probability 20/256
 *      (Beam: 1/13); letters, there and in extra, 9 or 10 in 256 each
 *      (not exactly uniform).  Speed.
 *    - Prices from a polynomial 10^x (relative error below 1e-11), not
 *      Math.pow: faster, and the same on every machine.
 *    - extra pads to the size nx_event_bytes() counts (every integer and
 *      every string, channel and url included); Beam leaves out date_time
 *      (persons, auctions) and the bid's channel and url, so its bids
 *      average ~185 bytes by this count.  Here the bid's channel and url
 *      alone average ~72 bytes, so bids come to ~108 (extra is empty when
 *      the rest is already over 100).
 *    - The bidder gets FIRST_PERSON_ID once (nexmark/nexmark's newest
 *      BidGenerator adds it twice, a bug).
 *    - Channel urls fixed per channel (note 5).
 *    - Disorder is a uniform delay per event (nexmark.h), not Beam's
 *      out-of-order groups; the auction length is computed without it.
 *    - No extended-bid mode, rate shapes or wall-clock event time.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nexmark.h"
#include "op_util.h" /* operators/: op_errorf */
#include "rate.h"    /* operators/: the generators' shared rate limiter */

__extension__ typedef unsigned __int128 u128;
__extension__ typedef __int128 i128;

/* Beam's defaults (NexmarkConfiguration, the generator classes). */
#define HOT_AUCTION_RATIO 2    /* P(hot auction) = 1 - 1/2 */
#define HOT_SELLER_RATIO 4     /* P(hot seller) = 1 - 1/4 */
#define HOT_BIDDER_RATIO 4     /* P(hot bidder) = 1 - 1/4 */
#define HOT_ID_ROUNDING 100    /* hot ids: first of the last 100 */
#define NUM_ACTIVE_PEOPLE 1000
#define NUM_IN_FLIGHT_AUCTIONS 100
#define PERSON_ID_LEAD 10
#define AUCTION_ID_LEAD 10
#define HOT_CHANNEL_RATIO 2 /* P(hot channel) = 1 - 1/2 */
#define CHANNELS 10000
/* Events until NUM_IN_FLIGHT_AUCTIONS more auctions: 100 * 50 / 3. */
#define AUCTION_HORIZON_EVENTS                                                 \
  ((uint64_t)NUM_IN_FLIGHT_AUCTIONS * NX_TOTAL_PROPORTION /                    \
   NX_AUCTION_PROPORTION)

#define DEFAULT_EVENTS_PER_SECOND 10000000u
#define DEFAULT_BASE_TIME_MS 1700000000000
#define DEFAULT_WATERMARK_LAG_MS 4000
#define MAX_EVENTS_PER_SECOND 1000000000000ull /* note 4: no overflow */
#define MAX_EVENTS (1ull << 62)                /* block arithmetic fits */

/* Room writers may use past a string's end (note 3). */
#define GEN_SLACK_BYTES 16u
/* Largest generated record: an auction with the longest name (19),
 * description (99) and extra (532); see gen_auction. */
#define GEN_MAX_RECORD_BYTES 728u
#define GEN_BUFFER_WORDS ((GEN_MAX_RECORD_BYTES + GEN_SLACK_BYTES + 7u) / 8u)

/* Rate limit (note 7). */
#define GEN_SLEEP_MAX_NS 1000000ull
/* Words of a saved position (note 6). */
#define POSITION_WORDS 7

_Static_assert(NX_PERSON_PROPORTION == 1, "lastBase0PersonId assumes 1");
_Static_assert(NX_SPLIT_BLOCK == 1024u, "blocks are shifts by 10");
_Static_assert(GEN_MAX_RECORD_BYTES + GEN_SLACK_BYTES <=
                   sizeof(((nx_generated *)0)->text),
               "nx_generated.text holds a record and its slack");
_Static_assert(offsetof(nx_generated, text) % 8 == 0,
               "nx_generated.text is 8-byte aligned for the record");

/* ------------------------------------------------------------ randomness */

/* splitmix64's finaliser. */
static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* wyrand: one 64x64->128 multiply per draw. */
typedef struct rng {
  uint64_t state;
} rng;

static inline uint64_t next64(rng *r) {
  r->state += 0xa0761d6478bd642full;
  u128 m = (u128)r->state * (r->state ^ 0xe7037ed1a0b428dbull);
  return (uint64_t)(m >> 64) ^ (uint64_t)m;
}

/* Uniform in 0 .. bound-1 (bound >= 1), by multiply-shift. */
static inline uint64_t below(rng *r, uint64_t bound) {
  return (uint64_t)(((u128)next64(r) * bound) >> 64);
}

/* ------------------------------------------------------------ plan */

/* A configuration, normalised, with what the hot path needs (note 4). */
typedef struct gen_plan {
  uint64_t events;
  uint64_t seed;
  uint64_t salt; /* mix of the seed */
  uint64_t rate; /* events per second */
  int64_t base_ms;
  int64_t max_delay_ms;
  uint64_t step_ms, step_rem;       /* 1000 = step_ms * rate + step_rem */
  uint64_t horizon_ms, horizon_rem; /* the same for 1000 * 1666 */
} gen_plan;

/* The undelayed date_time of event n, and n * 1000 mod rate. */
typedef struct gen_clock {
  int64_t time_ms;
  uint64_t rem;
} gen_clock;

static void channels_ready(void);

/* Also makes sure the channel table is filled (every event path starts
 * here). */
static gen_plan plan_of(const nx_generator_config *cfg) {
  channels_ready();
  gen_plan g = {0};
  g.events = cfg->events;
  g.seed = cfg->seed;
  g.salt = mix64(cfg->seed ^ 0x6e65786d61726b21ull); /* "nexmark!" */
  g.rate = cfg->events_per_second ? cfg->events_per_second
                                  : DEFAULT_EVENTS_PER_SECOND;
  g.base_ms = cfg->base_time_ms ? cfg->base_time_ms : DEFAULT_BASE_TIME_MS;
  g.max_delay_ms = cfg->max_out_of_order_ms;
  g.step_ms = 1000u / g.rate;
  g.step_rem = 1000u % g.rate;
  g.horizon_ms = AUCTION_HORIZON_EVENTS * 1000u / g.rate;
  g.horizon_rem = AUCTION_HORIZON_EVENTS * 1000u % g.rate;
  assert(g.rate >= 1 && g.rate <= MAX_EVENTS_PER_SECOND);
  return g;
}

static gen_clock clock_of(const gen_plan *g, uint64_t n) {
  u128 x = (u128)n * 1000u;
  return (gen_clock){.time_ms = g->base_ms + (int64_t)(uint64_t)(x / g->rate),
                     .rem = (uint64_t)(x % g->rate)};
}

static inline void clock_step(const gen_plan *g, gen_clock *c) {
  c->time_ms += (int64_t)g->step_ms;
  c->rem += g->step_rem;
  if (c->rem >= g->rate) {
    c->rem -= g->rate;
    c->time_ms++;
  }
  assert(c->rem < g->rate);
}

/* time(n + 1666) - time(n), both undelayed, from n's remainder. */
static inline uint64_t horizon_ms(const gen_plan *g, const gen_clock *c) {
  return g->horizon_ms + (c->rem + g->horizon_rem >= g->rate);
}

/* ------------------------------------------------------------ ids (Beam) */

int nx_event_type(uint64_t n) {
  uint64_t offset = n % NX_TOTAL_PROPORTION;
  if (offset < NX_PERSON_PROPORTION)
    return NX_PERSON;
  if (offset < NX_PERSON_PROPORTION + NX_AUCTION_PROPORTION)
    return NX_AUCTION;
  return NX_BID;
}

/* The newest person id (base 0) at event n: the current one for a person. */
static inline uint64_t last_person(uint64_t n) {
  return n / NX_TOTAL_PROPORTION;
}

/* The newest auction id (base 0) at event n: the current one for an
 * auction; -1 before the first. */
static inline int64_t last_auction(uint64_t n) {
  int64_t epoch = (int64_t)(n / NX_TOTAL_PROPORTION);
  int64_t offset = (int64_t)(n % NX_TOTAL_PROPORTION);
  if (offset < NX_PERSON_PROPORTION) {
    epoch--; /* the last auction of the previous epoch */
    offset = NX_AUCTION_PROPORTION - 1;
  } else if (offset >= NX_PERSON_PROPORTION + NX_AUCTION_PROPORTION) {
    offset = NX_AUCTION_PROPORTION - 1;
  } else {
    offset -= NX_PERSON_PROPORTION;
  }
  return epoch * NX_AUCTION_PROPORTION + offset;
}

/* A person among the active ones, or up to PERSON_ID_LEAD ahead. */
static inline uint64_t some_person(rng *r, uint64_t n) {
  uint64_t people = last_person(n) + 1;
  uint64_t active = people < NUM_ACTIVE_PEOPLE ? people : NUM_ACTIVE_PEOPLE;
  return people - active + below(r, active + PERSON_ID_LEAD);
}

/* An auction likely in flight, or up to AUCTION_ID_LEAD ahead; n is a
 * bid, so last_auction(n) >= 0. */
static inline uint64_t some_auction(rng *r, uint64_t n) {
  uint64_t last = (uint64_t)last_auction(n);
  uint64_t first = last > NUM_IN_FLIGHT_AUCTIONS ? last - NUM_IN_FLIGHT_AUCTIONS
                                                 : 0;
  return first + below(r, last - first + 1 + AUCTION_ID_LEAD);
}

/* 2^(j/8), j = 0 .. 7 (for next_price). */
static const double pow2_eighths[8] = {
    1.0,
    1.0905077326652577,
    1.189207115002721,
    1.2968395546510096,
    1.4142135623730951,
    1.5422108254079407,
    1.681792830507429,
    1.8340080864093424};

/* Beam's PriceGenerator: round(10^(6u) * 100), u uniform in [0, 1).
 * 10^(6u) = 2^y with y = 6u log2(10) < 19.94, as 2^(y's whole part) *
 * 2^(its eighths) * e^(the rest * ln 2), the last by a Taylor polynomial
 * (the rest * ln 2 < 0.087: relative error below 1e-11).  Plain + and *
 * (C11 mode: no contraction into FMA), so every machine and libm gives
 * the same prices, 5x faster than libm's exp. */
static inline int64_t next_price(rng *r) {
  double u = (double)(next64(r) >> 11) * 0x1.0p-53;
  double eighths = u * (8.0 * 6.0 * 3.321928094887362348);
  uint32_t e = (uint32_t)eighths; /* floor: eighths >= 0 */
  double x = (eighths - (double)e) * (0.125 * 0.6931471805599453094);
  double poly =
      1.0 +
      x * (1.0 +
           x * (1.0 / 2 +
                x * (1.0 / 6 +
                     x * (1.0 / 24 + x * (1.0 / 120 + x * (1.0 / 720))))));
  assert(e < 160);
  double v = (double)(1ull << (e >> 3)) * pow2_eighths[e & 7u] * poly;
  return (int64_t)(v * 100.0 + 0.5);
}

/* Beam's nextExtra: the length that brings current_bytes to avg_bytes on
 * average, +- 20%. */
static inline uint32_t extra_length(rng *r, uint32_t current_bytes,
                                    uint32_t avg_bytes) {
  if (current_bytes > avg_bytes)
    return 0;
  uint32_t rest = avg_bytes - current_bytes;
  uint32_t delta = (rest * 2u + 5u) / 10u; /* round(rest * 0.2) */
  uint32_t length = rest - delta;
  if (delta)
    length += (uint32_t)below(r, 2u * delta);
  assert(length <= rest + delta);
  return length;
}

/* ------------------------------------------------------------ strings */

/* 8 letters, one per byte of w: 'a' + b * 26 / 256.  Even and odd bytes
 * are scaled in 16-bit lanes, where b * 26 < 65536 cannot carry. */
static inline uint64_t letters8(uint64_t w) {
  const uint64_t lanes = 0x00ff00ff00ff00ffull;
  uint64_t even = (((w & lanes) * 26u) >> 8) & lanes;
  uint64_t odd = ((((w >> 8) & lanes) * 26u) >> 8) & lanes;
  return (even | (odd << 8)) + 0x6161616161616161ull; /* no byte carries */
}

/* length random letters (Beam's nextExactString); may store up to 7 bytes
 * more (note 3). */
static char *put_letters(rng *r, char *p, uint32_t length) {
  for (uint32_t i = 0; i < length; i += 8) {
    uint64_t v = letters8(next64(r));
    memcpy(p + i, &v, 8);
  }
  return p + length;
}

/* 8 characters of Beam's nextString: each the special one (a space or
 * '_') where the matching byte of v is below 20 (20 in 256), else the
 * letter from w.  Bytewise b < 20 without carries: (b | 0x80) - 20 keeps
 * its top bit iff (b & 0x7f) >= 20. */
static inline uint64_t words8(uint64_t w, uint64_t v, char special) {
  const uint64_t ones = 0x0101010101010101ull;
  const uint64_t tops = 0x8080808080808080ull;
  uint64_t t = (v | tops) - 20u * ones;
  uint64_t small = ~(t | v) & tops;   /* top bit set where b < 20 */
  uint64_t mask = (small >> 7) * 0xffu; /* 0xff there */
  return (letters8(w) & ~mask) | ((ones * (uint8_t)special) & mask);
}

/* Beam's nextString(max_length, special): 3 .. max_length-1 characters,
 * trimmed of spaces at both ends when special is a space.  May store up
 * to 7 bytes more. */
static char *put_words(rng *r, char *p, uint32_t max_length, char special) {
  uint32_t length = 3u + (uint32_t)below(r, max_length - 3u);
  for (uint32_t i = 0; i < length; i += 8) {
    uint64_t w = next64(r);
    uint64_t v = words8(w, next64(r), special);
    memcpy(p + i, &v, 8);
  }
  if (special != ' ')
    return p + length;
  uint32_t begin = 0;
  while (begin < length && p[begin] == ' ')
    begin++;
  while (length > begin && p[length - 1] == ' ')
    length--;
  if (begin)
    memmove(p, p + begin, length - begin);
  return p + (length - begin);
}

/* Decimal digits of v. */
static char *put_u64(char *p, uint64_t v) {
  char digits[20];
  uint32_t k = 20;
  do {
    digits[--k] = (char)('0' + v % 10u);
    v /= 10u;
  } while (v);
  memcpy(p, digits + k, 20u - k);
  return p + (20u - k);
}

/* A short string from a list; copies 15 bytes (note 3). */
typedef struct word {
  char text[15];
  uint8_t length;
} word;

static inline char *put_word(char *p, const word *w) {
  memcpy(p, w->text, sizeof w->text);
  return p + w->length;
}

#define WORD(s) {s, (uint8_t)(sizeof(s) - 1)}

/* Beam's lists (PersonGenerator, BidGenerator). */
static const word first_names[] = {
    WORD("Peter"), WORD("Paul"),  WORD("Luke"),  WORD("John"),
    WORD("Saul"),  WORD("Vicky"), WORD("Kate"),  WORD("Julie"),
    WORD("Sarah"), WORD("Deiter"), WORD("Walter")};
static const word last_names[] = {
    WORD("Shultz"), WORD("Abrams"), WORD("Spencer"),
    WORD("White"),  WORD("Bartels"), WORD("Walton"),
    WORD("Smith"),  WORD("Jones"),  WORD("Noris")};
static const word us_cities[] = {
    WORD("Phoenix"), WORD("Los Angeles"), WORD("San Francisco"),
    WORD("Boise"),   WORD("Portland"),    WORD("Bend"),
    WORD("Redmond"), WORD("Seattle"),     WORD("Kent"),
    WORD("Cheyenne")};
static const word us_states[] = {WORD("AZ"), WORD("CA"), WORD("ID"),
                                 WORD("OR"), WORD("WA"), WORD("WY")};
static const word hot_channels[] = {WORD("Google"), WORD("Facebook"),
                                    WORD("Baidu"), WORD("Apple")};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* "dddd dddd dddd dddd": 16 digits from one draw, as a fraction. */
static char *put_credit_card(rng *r, char *p) {
  uint64_t x = next64(r);
  for (int group = 0; group < 4; group++) {
    if (group)
      *p++ = ' ';
    for (int k = 0; k < 4; k++) {
      u128 t = (u128)x * 10u;
      *p++ = (char)('0' + (int)(t >> 64));
      x = (uint64_t)t;
    }
  }
  return p;
}

/* ------------------------------------------------------------ channels */

/* Java's Math.abs(Integer.reverse(n)): the bits of n reversed as an
 * int32, its absolute value (INT32_MIN stays negative, as in Java). */
static int64_t reversed_id(uint32_t n) {
  uint32_t v = n;
  v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
  v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
  v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
  v = ((v >> 8) & 0x00ff00ffu) | ((v & 0x00ff00ffu) << 8);
  v = (v >> 16) | (v << 16);
  int32_t s = (int32_t)v;
  return s == INT32_MIN ? (int64_t)s : (int64_t)(s < 0 ? -s : s);
}

/* What a channel's url has of its own (note 5): nexmark/nexmark's
 * getBaseUrl is "https://www.nexmark.com/" + three nextString(5, '_')
 * segments each followed by '/' + "item.htm?query=1", and the url of
 * channel N adds "&channel_id=" + Math.abs(Integer.reverse(N)) 9 times in
 * 10.  Channels 0 .. CHANNELS-1, then the hot ones. */
typedef struct channel_entry {
  char middle[15]; /* "seg/seg/seg/" */
  uint8_t middle_length;
  char id[15]; /* the decimal id */
  uint8_t id_length; /* 0: the url has no channel id */
} channel_entry;

_Static_assert(sizeof(channel_entry) == 32, "two entries per cache line");

#define URL_HEAD "https://www.nexmark.com/"
#define URL_TAIL "item.htm?query=1"
#define URL_ID "&channel_id="
#define URL_SALT 0x6368616e6e656c73ull /* "channels" */

static channel_entry channel_table[CHANNELS + COUNT(hot_channels)];
static pthread_once_t channel_once = PTHREAD_ONCE_INIT;

/* Fill entry i from its own fixed stream (the same in every process). */
static void channel_fill_one(uint32_t i) {
  channel_entry *e = &channel_table[i];
  rng r = {mix64(URL_SALT + i)};
  char middle[32], *p = middle;
  for (int segment = 0; segment < 3; segment++) {
    p = put_words(&r, p, 5, '_');
    *p++ = '/';
  }
  assert(p - middle <= (ptrdiff_t)sizeof e->middle);
  memcpy(e->middle, middle, (size_t)(p - middle));
  e->middle_length = (uint8_t)(p - middle);
  if (i < CHANNELS && below(&r, 10) > 0) {
    int64_t id = reversed_id(i);
    int length = snprintf(e->id, sizeof e->id, "%" PRId64, id);
    assert(length > 0 && length < (int)sizeof e->id);
    e->id_length = (uint8_t)length;
  }
}

static void channel_fill(void) {
  for (uint32_t i = 0; i < COUNT(channel_table); i++)
    channel_fill_one(i);
}

static void channels_ready(void) { pthread_once(&channel_once, channel_fill); }

/* A bid's channel and url from the decision bits d (gen_bid); returns the
 * end of the url and sets *url_begin and the channel's length. */
static char *put_channel(uint64_t d, char *p, char **url_begin,
                         uint16_t *channel_length) {
  char *begin = p;
  uint32_t i;
  if ((d >> 60) & 1u) { /* hot: below(HOT_CHANNEL_RATIO) > 0 */
    uint32_t hot = (uint32_t)(d >> 58) & 3u;
    p = put_word(p, &hot_channels[hot]);
    i = CHANNELS + hot;
  } else {
    i = (uint32_t)(((d & 0xffffffffu) * CHANNELS) >> 32);
    memcpy(p, "channel-", 8);
    p = put_u64(p + 8, i);
  }
  *channel_length = (uint16_t)(p - begin);
  *url_begin = p;
  const channel_entry *e = &channel_table[i];
  memcpy(p, URL_HEAD, sizeof URL_HEAD - 1);
  p += sizeof URL_HEAD - 1;
  memcpy(p, e->middle, sizeof e->middle);
  p += e->middle_length;
  memcpy(p, URL_TAIL, sizeof URL_TAIL - 1);
  p += sizeof URL_TAIL - 1;
  if (e->id_length) {
    memcpy(p, URL_ID, sizeof URL_ID - 1);
    memcpy(p + sizeof URL_ID - 1, e->id, sizeof e->id);
    p += sizeof URL_ID - 1 + e->id_length;
  }
  return p;
}

/* ------------------------------------------------------------ events */

/* Closes string i of the record being written: its length is p - *start,
 * and the next string starts at p. */
static inline void end_string(nx_record *rec, int i, char **start, char *p) {
  assert(p >= *start && p - *start <= (ptrdiff_t)NX_MAX_STRING_BYTES);
  rec->len[i] = (uint16_t)(p - *start);
  *start = p;
}

/* Beam's nextPerson; returns the end of the strings. */
static char *gen_person(rng *r, uint64_t n, int64_t t, nx_record *rec) {
  rec->type = NX_PERSON;
  rec->field[NX_PERSON_ID] = (int64_t)(last_person(n) + NX_FIRST_PERSON_ID);
  rec->field[NX_PERSON_DATE_TIME] = t;
  char *begin = (char *)(rec->field + 2);
  char *p = begin, *s = begin;
  p = put_word(p, &first_names[below(r, COUNT(first_names))]);
  *p++ = ' ';
  p = put_word(p, &last_names[below(r, COUNT(last_names))]);
  end_string(rec, 0, &s, p);
  p = put_words(r, p, 7, ' ');
  *p++ = '@';
  p = put_words(r, p, 5, ' ');
  memcpy(p, ".com", 4);
  p += 4;
  end_string(rec, 1, &s, p);
  p = put_credit_card(r, p);
  end_string(rec, 2, &s, p);
  p = put_word(p, &us_cities[below(r, COUNT(us_cities))]);
  end_string(rec, 3, &s, p);
  p = put_word(p, &us_states[below(r, COUNT(us_states))]);
  end_string(rec, 4, &s, p);
  uint32_t current = 2u * 8u + (uint32_t)(p - begin);
  p = put_letters(r, p, extra_length(r, current, NX_PERSON_AVG_BYTES));
  end_string(rec, 5, &s, p);
  return p;
}

/* Beam's nextAuction (the expiry from the horizon, note 4). */
static char *gen_auction(const gen_plan *g, rng *r, uint64_t n, int64_t t,
                         const gen_clock *c, nx_record *rec) {
  int64_t *f = rec->field;
  rec->type = NX_AUCTION;
  f[NX_AUCTION_ID] = last_auction(n) + NX_FIRST_AUCTION_ID;
  uint64_t seller = below(r, HOT_SELLER_RATIO) > 0
                        ? last_person(n) / HOT_ID_ROUNDING * HOT_ID_ROUNDING
                        : some_person(r, n);
  f[NX_AUCTION_SELLER] = (int64_t)(seller + NX_FIRST_PERSON_ID);
  f[NX_AUCTION_CATEGORY] =
      NX_FIRST_CATEGORY_ID + (int64_t)below(r, NX_CATEGORIES);
  f[NX_AUCTION_INITIAL_BID] = next_price(r);
  f[NX_AUCTION_RESERVE] = f[NX_AUCTION_INITIAL_BID] + next_price(r);
  uint64_t twice_horizon = 2u * horizon_ms(g, c);
  f[NX_AUCTION_DATE_TIME] = t;
  f[NX_AUCTION_EXPIRES] =
      t + 1 + (int64_t)below(r, twice_horizon > 1 ? twice_horizon : 1);
  char *begin = (char *)(f + 7);
  char *p = begin, *s = begin;
  p = put_words(r, p, 20, ' ');
  end_string(rec, 0, &s, p);
  p = put_words(r, p, 100, ' ');
  end_string(rec, 1, &s, p);
  uint32_t current = 7u * 8u + (uint32_t)(p - begin);
  p = put_letters(r, p, extra_length(r, current, NX_AUCTION_AVG_BYTES));
  end_string(rec, 2, &s, p);
  assert(f[NX_AUCTION_EXPIRES] > t);
  return p;
}

/* Beam's nextBid, with nexmark/nexmark's channel and url.  The choices
 * with power-of-two odds share one draw d, each from its own bits: 63 hot
 * auction (1 in HOT_AUCTION_RATIO = 2 is not), 61-62 hot bidder (1 in 4
 * is not), 60 hot channel, 58-59 which, 0-31 the channel otherwise. */
static char *gen_bid(rng *r, uint64_t n, int64_t t, nx_record *rec) {
  _Static_assert(HOT_AUCTION_RATIO == 2 && HOT_BIDDER_RATIO == 4 &&
                     HOT_CHANNEL_RATIO == 2 && COUNT(hot_channels) == 4,
                 "the bit fields of d");
  int64_t *f = rec->field;
  rec->type = NX_BID;
  uint64_t d = next64(r);
  uint64_t auction =
      (d >> 63)
          ? (uint64_t)last_auction(n) / HOT_ID_ROUNDING * HOT_ID_ROUNDING
          : some_auction(r, n);
  uint64_t bidder =
      ((d >> 61) & 3u) ? last_person(n) / HOT_ID_ROUNDING * HOT_ID_ROUNDING + 1
                       : some_person(r, n);
  f[NX_BID_AUCTION] = (int64_t)(auction + NX_FIRST_AUCTION_ID);
  f[NX_BID_BIDDER] = (int64_t)(bidder + NX_FIRST_PERSON_ID);
  f[NX_BID_PRICE] = next_price(r);
  f[NX_BID_DATE_TIME] = t;
  char *begin = (char *)(f + 4);
  char *url = begin;
  char *p = put_channel(d, begin, &url, &rec->len[0]);
  char *s = url;
  end_string(rec, 1, &s, p);
  uint32_t current = 4u * 8u + (uint32_t)(p - begin);
  p = put_letters(r, p, extra_length(r, current, NX_BID_AVG_BYTES));
  end_string(rec, 2, &s, p);
  assert(rec->len[0] > 0);
  return p;
}

/* Event n as an nx_record in buffer (GEN_BUFFER_WORDS words); returns its
 * size and sets *date_time (note 3). */
static uint32_t gen_record(const gen_plan *g, uint64_t n, const gen_clock *c,
                           uint64_t *buffer, int64_t *date_time) {
  rng r = {mix64(g->salt + n * 0x9e3779b97f4a7c15ull)};
  int64_t t = c->time_ms;
  if (g->max_delay_ms > 0)
    t -= (int64_t)below(&r, (uint64_t)g->max_delay_ms + 1u);
  nx_record *rec = (nx_record *)buffer;
  memset(rec, 0, sizeof *rec);
  char *end;
  switch (nx_event_type(n)) {
  case NX_PERSON:
    end = gen_person(&r, n, t, rec);
    break;
  case NX_AUCTION:
    end = gen_auction(g, &r, n, t, c, rec);
    break;
  default:
    end = gen_bid(&r, n, t, rec);
    break;
  }
  uint32_t used = (uint32_t)(end - (char *)buffer);
  uint32_t size = (used + 7u) & ~7u;
  memset(end, 0, size - used); /* as nx_encode: equal events, equal bytes */
  assert(size <= GEN_MAX_RECORD_BYTES);
  *date_time = t;
  return size;
}

/* ------------------------------------------------------------ validation */

/* The generator's refusals: EINVAL with the message in err (op_util.h). */
#define invalid(...) op_errorf(EINVAL, __VA_ARGS__)

int nx_generator_validate(const nx_generator_config *cfg, char *err,
                          size_t err_bytes) {
  if (err && err_bytes)
    err[0] = 0;
  if (!cfg)
    return invalid(err, err_bytes, "no generator configuration");
  if (cfg->events > MAX_EVENTS)
    return invalid(err, err_bytes, "events %" PRIu64 " is above 2^62",
                   cfg->events);
  if (cfg->events_per_second > MAX_EVENTS_PER_SECOND)
    return invalid(err, err_bytes, "events_per_second %" PRIu64
                   " is above 10^12", cfg->events_per_second);
  if (cfg->max_out_of_order_ms < 0)
    return invalid(err, err_bytes, "max_out_of_order_ms %" PRId64
                   " is negative", cfg->max_out_of_order_ms);
  gen_plan g = plan_of(cfg);
  /* The latest time: the last event's, plus an auction's longest length
   * (1 + 2 * horizon); the earliest: the base minus the largest delay. */
  uint64_t last = g.events ? g.events - 1 : 0;
  i128 latest = (i128)g.base_ms + (i128)((u128)last * 1000u / g.rate) + 1 +
                2 * ((i128)g.horizon_ms + 1);
  if (latest > (i128)INT64_MAX)
    return invalid(err, err_bytes, "date_time would pass INT64_MAX (base_time_"
                   "ms %" PRId64 ", %" PRIu64 " events at %" PRIu64 "/s)",
                   g.base_ms, g.events, g.rate);
  if ((i128)g.base_ms - (i128)g.max_delay_ms <= (i128)INT64_MIN)
    return invalid(err, err_bytes, "base_time_ms %" PRId64 " minus max_out_"
                   "of_order_ms %" PRId64 " reaches SL_NO_TIMESTAMP",
                   g.base_ms, g.max_delay_ms);
  return 0;
}

void nx_generate(const nx_generator_config *cfg, uint64_t n,
                 nx_generated *out) {
  assert(cfg && out && n < cfg->events);
  gen_plan g = plan_of(cfg);
  gen_clock c = clock_of(&g, n);
  int64_t date_time;
  uint64_t *buffer = (uint64_t *)(void *)out->text;
  uint32_t size = gen_record(&g, n, &c, buffer, &date_time);
  int rc = nx_decode(buffer, size, &out->event);
  assert(rc == 0);
  (void)rc;
}

/* ------------------------------------------------------------ source */

/* The operator's data: a copy the job owns and frees. */
typedef struct gen_source {
  nx_generator_config cfg;
  uint64_t rate_limit; /* events per second per instance; 0: none */
} gen_source;

typedef struct gen_instance {
  gen_plan plan;
  uint64_t instance, parallelism;
  uint64_t next;   /* the position (note 6) */
  gen_clock clock; /* of next, while next < events */
  rate_limiter pace; /* the rate limit's schedule (note 7) */
  uint64_t record[GEN_BUFFER_WORDS];
} gen_instance;

static void gen_seek(gen_instance *gi, uint64_t n) {
  assert(n / NX_SPLIT_BLOCK % gi->parallelism == gi->instance);
  gi->next = n;
  if (n < gi->plan.events)
    gi->clock = clock_of(&gi->plan, n);
}

static int gen_open(sl_ctx *ctx, void *user, void **state) {
  const gen_source *src = user;
  gen_instance *gi = calloc(1, sizeof *gi);
  if (!gi) {
    sl_ctx_fail(ctx, "out of memory");
    return -ENOMEM;
  }
  gi->plan = plan_of(&src->cfg);
  /* The rest of a block is at most a block, so a burst is never cut. */
  gi->pace = rate_limiter_make(src->rate_limit, NX_SPLIT_BLOCK,
                               GEN_SLEEP_MAX_NS);
  gi->instance = (uint64_t)sl_ctx_instance(ctx);
  gi->parallelism = (uint64_t)sl_ctx_parallelism(ctx);
  gen_seek(gi, gi->instance * NX_SPLIT_BLOCK);
  *state = gi;
  return 0;
}

static void gen_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  free(state);
}

/* Emits at most the rest of the current block (note 6). */
static int gen_next(sl_ctx *ctx, void *state) {
  gen_instance *gi = state;
  const gen_plan *g = &gi->plan;
  if (gi->next >= g->events)
    return SL_SOURCE_END;
  uint64_t block = gi->next / NX_SPLIT_BLOCK;
  uint64_t block_end = (block + 1) * NX_SPLIT_BLOCK;
  if (block_end > g->events)
    block_end = g->events;
  uint64_t due = rate_due(&gi->pace, ctx, block_end - gi->next);
  assert(due <= NX_SPLIT_BLOCK);
  for (uint64_t i = 0; i < due; i++) {
    int64_t date_time;
    uint32_t size = gen_record(g, gi->next, &gi->clock, gi->record,
                               &date_time);
    int rc = sl_emit_ts(ctx, gi->record, size, date_time);
    if (rc == SL_ETOOBIG)
      sl_ctx_fail(ctx, "event %" PRIu64 ": a record of %" PRIu32 " bytes is "
                  "over the job's max_record_bytes", gi->next, size);
    if (rc)
      return rc; /* not emitted: the position stays on it */
    gi->next++;
    clock_step(g, &gi->clock);
    rate_emitted(&gi->pace, 1);
  }
  if (gi->next == block_end)
    gen_seek(gi, (block + gi->parallelism) * NX_SPLIT_BLOCK);
  return gi->next >= g->events ? SL_SOURCE_END : 0;
}

/* The saved position: next, then what must not change (note 6). */
static void gen_position(const gen_instance *gi,
                         uint64_t words[POSITION_WORDS]) {
  const gen_plan *g = &gi->plan;
  words[0] = gi->next;
  words[1] = g->seed;
  words[2] = g->events;
  words[3] = g->rate;
  words[4] = (uint64_t)g->base_ms;
  words[5] = (uint64_t)g->max_delay_ms;
  words[6] = gi->parallelism;
}

static int gen_snapshot(sl_ctx *ctx, void *state, uint64_t id) {
  (void)id;
  uint64_t words[POSITION_WORDS];
  gen_position(state, words);
  return sl_operator_state_set(ctx, words, sizeof words);
}

static int gen_restore(sl_ctx *ctx, void *state, uint64_t id) {
  gen_instance *gi = state;
  const void *data;
  uint32_t bytes;
  int rc = sl_operator_state_get(ctx, &data, &bytes);
  if (rc == SL_ENOTFOUND)
    return 0; /* nothing saved: from the beginning */
  if (rc)
    return rc;
  uint64_t saved[POSITION_WORDS], mine[POSITION_WORDS];
  if (bytes != sizeof saved) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 ": the Nexmark generator's "
                "position is %" PRIu32 " bytes, not %zu", id, bytes,
                sizeof saved);
    return -EINVAL;
  }
  memcpy(saved, data, sizeof saved);
  gen_position(gi, mine);
  if (memcmp(saved + 1, mine + 1, 5 * sizeof saved[0]) != 0) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 " was written by a Nexmark "
                "generator with seed %" PRIu64 ", %" PRIu64 " events, %"
                PRIu64 " events/s, base time %" PRId64 " ms, disorder %"
                PRId64 " ms; this one has seed %" PRIu64 ", %" PRIu64
                " events, %" PRIu64 " events/s, base time %" PRId64 " ms, "
                "disorder %" PRId64 " ms", id, saved[1], saved[2], saved[3],
                (int64_t)saved[4], (int64_t)saved[5], mine[1], mine[2],
                mine[3], (int64_t)mine[4], (int64_t)mine[5]);
    return -EINVAL;
  }
  if (saved[6] != mine[6] ||
      saved[0] / NX_SPLIT_BLOCK % gi->parallelism != gi->instance) {
    sl_ctx_fail(ctx, "checkpoint %" PRIu64 " was written by a Nexmark "
                "generator of parallelism %" PRIu64 ", this one has %"
                PRIu64 " (position %" PRIu64 " of instance %" PRIu64 ")",
                id, saved[6], mine[6], saved[0], gi->instance);
    return -EINVAL;
  }
  gen_seek(gi, saved[0]);
  return 0;
}

int nx_source_generator(sl_job *job, const char *name, int parallelism,
                        const nx_generator_config *cfg,
                        const nx_source_config *source, sl_op **op) {
  if (!job || !op || nx_generator_validate(cfg, NULL, 0) != 0)
    return EINVAL;
  nx_source_config sc = source ? *source : (nx_source_config){0};
  if (sc.watermark_lag_ms < 0)
    return EINVAL;
  gen_source *src = calloc(1, sizeof *src);
  if (!src)
    return ENOMEM;
  src->cfg = *cfg;
  src->rate_limit = sc.events_per_second_limit;
  static const sl_source_ops ops = {.open = gen_open,
                                    .next = gen_next,
                                    .close = gen_close,
                                    .snapshot = gen_snapshot,
                                    .restore = gen_restore};
  int rc = sl_op_source(job, name, parallelism, &ops, src, op);
  if (rc) {
    free(src);
    return rc;
  }
  /* The job frees the copy when it is destroyed. */
  rc = sl_op_set_user_free(*op, free);
  assert(rc == 0);
  sl_watermark_config wc = {
      .out_of_orderness = sc.watermark_lag_ms ? sc.watermark_lag_ms
                                              : DEFAULT_WATERMARK_LAG_MS,
      .every_call = sc.deterministic_watermarks != 0};
  return sl_op_watermarks(*op, &wc);
}
