/* queries.c — the table of the Nexmark queries: each number's CSV header
 * and builder (one file per query, q0.c ... q11.c), and nx_query_parse,
 * nx_query_count, nx_query_at, nx_query_build and nx_query_header over it
 * (nexmark.h). */

#include <stddef.h>
#include <string.h>

#include "query.h"

/* The table of queries. */

typedef int (*build_fn)(sl_job *job, sl_op *events, int p, sl_op **result);

static const struct query {
  int number;
  const char *header;
  build_fn build;
} queries[] = {
    {NX_Q0, "auction,bidder,price,date_time", nxq_build_q0},
    {NX_Q1, "auction,bidder,price,date_time", nxq_build_q1},
    {NX_Q2, "auction,price", nxq_build_q2},
    {NX_Q3, "name,city,state,id", nxq_build_q3},
    {NX_Q4, "category,avg_price", nxq_build_q4},
    {NX_Q5, "window_start,window_end,auction,num", nxq_build_q5},
    {NX_Q7, "window_start,window_end,auction,bidder,price,date_time",
     nxq_build_q7},
    {NX_Q8, "window_start,window_end,id,name", nxq_build_q8},
    {NX_Q11, "bidder,window_start,window_end,bid_count", nxq_build_q11},
};

#define QUERY_COUNT ((int)(sizeof queries / sizeof queries[0]))

static const struct query *query_find(int q) {
  for (int i = 0; i < QUERY_COUNT; i++)
    if (queries[i].number == q)
      return &queries[i];
  return NULL;
}

int nx_query_parse(const char *text) {
  if (text == NULL)
    return -1;
  if (text[0] == 'q' || text[0] == 'Q')
    text++;
  /* One or two digits, no sign, no leading zero, nothing after. */
  size_t n = strlen(text);
  if (n < 1 || n > 2 || (n == 2 && text[0] == '0'))
    return -1;
  int q = 0;
  for (size_t i = 0; i < n; i++) {
    if (text[i] < '0' || text[i] > '9')
      return -1;
    q = q * 10 + (text[i] - '0');
  }
  return query_find(q) ? q : -1;
}

int nx_query_count(void) { return QUERY_COUNT; }

int nx_query_at(int i) {
  return i >= 0 && i < QUERY_COUNT ? queries[i].number : -1;
}

int nx_query_build(sl_job *job, int query, sl_op *events, int parallelism,
                   sl_op **result) {
  const struct query *q = query_find(query);
  if (job == NULL || events == NULL || result == NULL || q == NULL)
    return EINVAL;
  return q->build(job, events, parallelism, result);
}

const char *nx_query_header(int query) {
  const struct query *q = query_find(query);
  return q ? q->header : NULL;
}
