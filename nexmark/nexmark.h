/* nexmark.h — the Nexmark benchmark on sluice's public API: the event
 * model, the standard generator, event files (JSON lines) and the queries
 * q0-q5, q7, q8, q11.  Used by `sluice nexmark`, the nexmark tests and
 * bench/nexmark_bench.  Everything here is built on include/sluice.h only
 * (the queries double as examples of the API), except two small internal
 * headers of the library, so that one rule holds on both sides: the
 * checked time arithmetic (engine/time_check.h) and the UTF-8 check
 * (operators/utf8_check.h).  Event times in a file must lie in
 * SL_TIME_MIN_VALID .. SL_TIME_MAX_VALID and strings be UTF-8, or the
 * parser refuses the line (json.c notes 2, 7).
 *
 * OVERVIEW
 *
 * Events.  A Nexmark stream mixes three kinds of events, 1 : 3 : 46 in
 * every 50 (person, auction, bid), as the generator of the nexmark/nexmark
 * Flink runner and of Apache Beam makes them.  Inside a job an event is an
 * nx_record: a fixed part (type, the string lengths, the integer fields of
 * its kind) followed by its strings back to back, no NULs; nx_decode gives
 * a view with every field, nx_encode builds a record from a view.  The
 * record's timestamp (sl_record.timestamp) is the event's date_time, in
 * milliseconds since the epoch.
 *
 * Generator.  Event n (0, 1, 2, ...) is a pure function of (config, n):
 * its kind from n % 50, its ids from n (as Beam's lastBase0PersonId /
 * lastBase0AuctionId / nextBase0*Id, with hot sellers, bidders and
 * auctions), its random fields from a PRNG seeded with (seed, n).  So any
 * split over instances, any restore, and a test's reference all see the
 * same events.  Instance k of P emits the blocks of NX_SPLIT_BLOCK
 * consecutive event numbers k, k + P, k + 2P, ... so the instances move
 * through event time together.
 *
 * Event time: date_time(n) = base_time_ms + n * 1000 / events_per_second
 * (integer division), minus a delay drawn from (seed, n) in
 * [0, max_out_of_order_ms] when disorder is on.  With a watermark lag above
 * max_out_of_order_ms no event is ever late.
 *
 * Queries.  nx_query_build() adds a query's operators behind an event
 * stream and returns its result stream.  Result records are query-specific
 * structs (below); nx_query_format() turns one into its CSV line, and
 * nx_query_header() gives the header line.  Columns and rules:
 *
 *   q0  auction,bidder,price,date_time   every bid
 *   q1  auction,bidder,price,date_time   every bid, price = 0.908 x price
 *                                        with exactly 3 decimals (exact:
 *                                        price * 908 / 1000)
 *   q2  auction,price                    bids with auction % 123 == 0
 *   q3  name,city,state,id               every (auction, person) pair with
 *                                        auction.seller = person.id,
 *                                        auction.category = 10 and
 *                                        person.state in OR, ID, CA
 *                                        (unbounded join; strings quoted
 *                                        as RFC 4180 when needed)
 *   q4  category,avg_price               per category, over the auctions
 *                                        that have at least one bid with
 *                                        date_time in [auction.date_time,
 *                                        auction.expires], the average of
 *                                        each one's highest such bid; one
 *                                        row per category at the end of
 *                                        input, the exact average rounded
 *                                        half up to 3 decimals
 *   q5  window_start,window_end,auction,num
 *                                        sliding windows of 10 s every 2 s
 *                                        over bids: per window, every
 *                                        auction whose bid count equals the
 *                                        window's largest
 *   q7  window_start,window_end,auction,bidder,price,date_time
 *                                        tumbling 10 s windows over bids:
 *                                        every bid whose price equals the
 *                                        window's highest
 *   q8  window_start,window_end,id,name  tumbling 10 s windows: each
 *                                        distinct (person id, name, window)
 *                                        such that the person registered
 *                                        in the window and some auction
 *                                        with seller = id opened in it
 *   q11 bidder,window_start,window_end,bid_count
 *                                        session windows of bids per
 *                                        bidder, gap 10 s: [first bid,
 *                                        last bid + 10 s), a new session
 *                                        when a bid comes 10 s or more
 *                                        after the previous one
 *
 * Windows are [start, end) in epoch milliseconds.  Output rows carry no
 * order across instances: compare them as sorted sets of lines.
 *
 * CAVEATS
 *
 * - Records later than the watermark lag are dropped by the windowed
 *   queries (and counted as late), as in Flink; generated events are never
 *   late when max_out_of_order_ms < watermark_lag_ms.
 * - The event-file source runs at parallelism 1 (it is replayable by byte
 *   offset); the generator at any parallelism.
 * - Event files are trusted for ranges: auction ids must be unique (q4
 *   keeps the first of a repeated id, so its result then depends on
 *   arrival order), q4's sums are int64 (prices near 2^63 / count
 *   overflow), and date_time and expires must stay well inside int64
 *   (window arithmetic near the limits overflows; INT64_MIN is
 *   SL_NO_TIMESTAMP).  The generator stays far inside all three.
 * - A builder cannot put its reason into sl_job_error(), so a bad
 *   generator configuration is reported by its EINVAL alone;
 *   nx_generator_validate() says why.
 */
#ifndef SLUICE_NEXMARK_H
#define SLUICE_NEXMARK_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

/* ------------------------------------------------------------------------ */
/* Events. */

enum nx_type { NX_PERSON = 0, NX_AUCTION = 1, NX_BID = 2 };

/* Proportions per NX_TOTAL_PROPORTION events (Beam's defaults). */
#define NX_PERSON_PROPORTION 1
#define NX_AUCTION_PROPORTION 3
#define NX_BID_PROPORTION 46
#define NX_TOTAL_PROPORTION 50

/* Ids start here (Beam's FIRST_PERSON_ID, FIRST_AUCTION_ID,
 * FIRST_CATEGORY_ID); categories are 10 .. 14. */
#define NX_FIRST_PERSON_ID 1000
#define NX_FIRST_AUCTION_ID 1000
#define NX_FIRST_CATEGORY_ID 10
#define NX_CATEGORIES 5

/* Average sizes the generator pads each kind to with its `extra` field,
 * counted as Beam does: 8 bytes per integer field plus the string bytes.
 * (Bids come to ~108: their channel and url alone often pass 68 bytes.) */
#define NX_PERSON_AVG_BYTES 200
#define NX_AUCTION_AVG_BYTES 500
#define NX_BID_AVG_BYTES 100

/* The strings of one event are at most this long each (longer ones in an
 * event file are refused). */
#define NX_MAX_STRING_BYTES 4096u
/* Largest nx_record: the fixed part and 6 strings at their limit. */
#define NX_MAX_RECORD_BYTES (80u + 6u * NX_MAX_STRING_BYTES)

/* A string field of a decoded event: not NUL-terminated. */
typedef struct nx_str {
  const char *ptr;
  uint32_t len;
} nx_str;

typedef struct nx_person {
  int64_t id;
  nx_str name, email_address, credit_card, city, state;
  int64_t date_time;
  nx_str extra;
} nx_person;

typedef struct nx_auction {
  int64_t id;
  nx_str item_name, description;
  int64_t initial_bid, reserve, date_time, expires, seller, category;
  nx_str extra;
} nx_auction;

typedef struct nx_bid {
  int64_t auction, bidder, price;
  nx_str channel, url;
  int64_t date_time;
  nx_str extra;
} nx_bid;

/** A decoded event: a view whose strings point into the record (or into
 * whatever the caller filled it from). */
typedef struct nx_event {
  int type; /* enum nx_type */
  union {
    nx_person person;
    nx_auction auction;
    nx_bid bid;
  } u;
} nx_event;

/* The fixed part of a record.  Integer fields of the kind in the order of
 * the structs above (person: id, date_time; auction: id, initial_bid,
 * reserve, date_time, expires, seller, category; bid: auction, bidder,
 * price, date_time), then the strings in struct order, lengths in len[]
 * (unused lengths 0).  Hot paths may read type and the integers directly
 * through the NX_* field indices below. */
typedef struct nx_record {
  uint32_t type;
  uint16_t len[6];
  int64_t field[]; /* 2, 7 or 4 integers, then the strings */
} nx_record;
_Static_assert(sizeof(nx_record) == 16, "nx_record's fixed head is 16 bytes");

enum {
  NX_PERSON_ID = 0, NX_PERSON_DATE_TIME = 1,
  NX_AUCTION_ID = 0, NX_AUCTION_INITIAL_BID = 1, NX_AUCTION_RESERVE = 2,
  NX_AUCTION_DATE_TIME = 3, NX_AUCTION_EXPIRES = 4, NX_AUCTION_SELLER = 5,
  NX_AUCTION_CATEGORY = 6,
  NX_BID_AUCTION = 0, NX_BID_BIDDER = 1, NX_BID_PRICE = 2,
  NX_BID_DATE_TIME = 3,
};

/** Bytes nx_encode needs for e (a multiple of 8). */
uint32_t nx_encoded_size(const nx_event *e);

/** Encode e into buffer (8-byte aligned).  Returns the record's size, or
 * the size needed if above buffer_bytes (nothing useful is written then).
 * A string over NX_MAX_STRING_BYTES or an unknown type: returns 0. */
uint32_t nx_encode(const nx_event *e, void *buffer, uint32_t buffer_bytes);

/** Decode a record into a view pointing into data.  Returns 0, or EINVAL
 * when the record is malformed (unknown type, lengths past its end). */
int nx_decode(const void *data, uint32_t size_bytes, nx_event *out);

/** The event's Beam-style size: 8 per integer field plus string bytes. */
uint32_t nx_event_bytes(const nx_event *e);

/* ------------------------------------------------------------------------ */
/* Generator (generator.c). */

#define NX_SPLIT_BLOCK 1024u

typedef struct nx_generator_config {
  uint64_t events;            /* events in all (every instance) */
  uint64_t seed;              /* equal seeds, equal events */
  uint64_t events_per_second; /* event-time rate; 0: 10,000,000 (the
                                 nexmark/nexmark default) */
  int64_t base_time_ms;       /* date_time of event 0; 0: 1700000000000 */
  int64_t max_out_of_order_ms; /* >= 0: each event's date_time is moved
                                  back by a uniform draw in [0, this] */
} nx_generator_config;

/** Check a configuration; 0, or EINVAL with the reason in err. */
int nx_generator_validate(const nx_generator_config *cfg, char *err,
                          size_t err_bytes);

/** Storage for one generated event: the view and the bytes its strings
 * point into. */
typedef struct nx_generated {
  nx_event event;
  char text[2048];
} nx_generated;

/** Event n of cfg (n < cfg->events), exactly as the generator source
 * emits it. */
void nx_generate(const nx_generator_config *cfg, uint64_t n,
                 nx_generated *out);

/** The kind of event n (from n % 50 alone). */
int nx_event_type(uint64_t n);

/** The generator as a source of P instances, each emitting its blocks
 * (see OVERVIEW) as nx_records with sl_emit_ts(date_time), and watermarks
 * that lag the largest date_time it emitted by watermark_lag_ms
 * (sl_op_watermarks; every_call when deterministic_watermarks).
 * Replayable: the next event number is checkpointed.  Errors: EINVAL (bad
 * config, see nx_generator_validate(); a negative watermark_lag_ms), as
 * the builders. */
typedef struct nx_source_config {
  int64_t watermark_lag_ms;    /* 0: 4000 (Nexmark's) */
  int deterministic_watermarks; /* 1: a watermark after every next() */
  uint64_t events_per_second_limit; /* wall-clock limit per instance; 0:
                                       none */
} nx_source_config;

int nx_source_generator(sl_job *job, const char *name, int parallelism,
                        const nx_generator_config *cfg,
                        const nx_source_config *source, sl_op **op);

/* ------------------------------------------------------------------------ */
/* Event files: one JSON object per line (json.c). */

/** Write e as one JSON line (with its newline) in the format of
 * docs/nexmark.md ({"event_type":N,"person":{...}}, fields in struct order, strings
 * escaped as JSON needs; other bytes as they are).  Returns the length
 * (a NUL follows when there is room, not counted), or the length needed
 * if it is above buffer_bytes; 0 for an unknown type. */
size_t nx_json_write(const nx_event *e, char *buffer, size_t buffer_bytes);

/** Parse one JSON line (no newline needed) into out, whose strings then
 * point into storage (storage_bytes at least len).  Returns 0, or EINVAL
 * with the reason in err ("field \"price\": expected an integer", ...). */
int nx_json_parse(const char *line, size_t len, nx_event *out, char *storage,
                  size_t storage_bytes, char *err, size_t err_bytes);

/** A source (parallelism 1) of the events in the files at paths (read in
 * order), as nx_records stamped with date_time, with watermarks as
 * nx_source_generator's.  Replayable by (file, byte offset); a restore
 * refuses a changed file list or a file now shorter than the position.  A
 * malformed line fails the job with "FILE line N: reason"; empty and
 * blank lines are skipped.  Errors: EINVAL (no paths, a path NULL, empty
 * or of 4096 bytes or more, a negative watermark_lag_ms), as the
 * builders. */
int nx_source_file(sl_job *job, const char *name, const char *const *paths,
                   int path_count, const nx_source_config *source,
                   sl_op **op);

/* ------------------------------------------------------------------------ */
/* Queries (queries.c, one file per query: q0.c ... q11.c, format.c). */

enum nx_query {
  NX_Q0 = 0, NX_Q1 = 1, NX_Q2 = 2, NX_Q3 = 3, NX_Q4 = 4, NX_Q5 = 5,
  NX_Q7 = 7, NX_Q8 = 8, NX_Q11 = 11,
};

/** Parse "q0" .. "q11" (also "0" .. "11"); -1 if not a query we run. */
int nx_query_parse(const char *text);

/** The queries in order, for loops: count and the i-th. */
int nx_query_count(void);
int nx_query_at(int i);

/** Add query q's operators behind events (a stream of nx_records) with
 * the given parallelism; *result is the stream of its result records.
 * Operator names start with "qN.".  Errors: EINVAL (unknown query), as the
 * builders. */
int nx_query_build(sl_job *job, int query, sl_op *events, int parallelism,
                   sl_op **result);

/** The CSV header of query q (no newline), or NULL. */
const char *nx_query_header(int query);

/** An sl_format_fn: a result record of the query (void *)(intptr_t)q as
 * its CSV line, no newline.  Returns the length (or the length needed). */
int nx_query_format(void *query, const sl_record *in, char *buffer,
                    uint32_t buffer_bytes);

#endif /* SLUICE_NEXMARK_H */
