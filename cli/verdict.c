/* verdict.c — whether a finished `sluice run` job's result holds, with
 * the reason in words: the pipeline and keyed jobs' checksums against the
 * closed form, the count job's committed files (every key counted 1..c_k,
 * no loss, no duplicate), and the window job's exactly-once verdict on its
 * committed files and its verifying sink. */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The committed part files of the file sink's directory dir ("part-*"),
 * sorted by name, into *names (*count of them; NULL when none: the caller
 * frees each name and the array), and how many uncommitted parts
 * (".part-*") lie beside them into *pending.  False, and nothing listed,
 * when dir cannot be opened (errno says why).  The listing stops early
 * only when memory runs out; the checks then find lines missing. */
static bool list_parts(const char *dir, char ***names, size_t *count,
                       uint64_t *pending) {
  assert(*names == NULL && *count == 0);
  DIR *d = opendir(dir);
  if (!d)
    return false;
  struct dirent *e;
  while ((e = readdir(d))) { /* bounded by the directory's entries */
    if (strncmp(e->d_name, ".part-", 6) == 0)
      (*pending)++;
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    char **more = realloc(*names, sizeof **names * (*count + 1));
    if (!more)
      break;
    *names = more;
    (*names)[(*count)++] = strdup(e->d_name);
  }
  closedir(d);
  if (*count > 0) /* names is NULL when empty */
    qsort(*names, *count, sizeof **names, compare_names);
  return true;
}

/* Check the committed output of the count job: every key k has exactly the
 * lines k,1 .. k,c_k (in order within its instance's files) — no loss, no
 * duplicate — and no pending part is left. */
bool verify_output(const options *o, char *why, size_t why_size) {
  uint64_t lines = 0, bad = 0, pending = 0;
  char **names = 0;
  size_t count = 0;
  if (!list_parts(o->output_dir, &names, &count, &pending)) {
    snprintf(why, why_size, "cannot read %s: %s", o->output_dir,
             strerror(errno));
    return false;
  }
  uint64_t *seen = calloc(o->keys, sizeof *seen);
  for (size_t i = 0; i < count && seen; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", o->output_dir, names[i]);
    FILE *f = fopen(path, "r");
    unsigned long long k, c;
    while (f && fscanf(f, "%llu,%llu\n", &k, &c) == 2) {
      lines++;
      if (k >= o->keys || c != seen[k] + 1)
        bad++; /* lost, duplicated or out of order */
      else
        seen[k] = c;
    }
    if (f)
      fclose(f);
    free(names[i]);
  }
  free(names);
  uint64_t full = o->records / o->keys, rest = o->records % o->keys;
  uint64_t short_keys = 0;
  for (uint64_t k = 0; k < o->keys && seen; k++)
    short_keys += seen[k] != full + (k < rest);
  free(seen);
  bool ok = lines == o->records && bad == 0 && short_keys == 0 && pending == 0;
  snprintf(why, why_size,
           "%" PRIu64 " committed lines in %zu files, expected %" PRIu64
           "; %" PRIu64 " out of sequence, %" PRIu64 " keys short, %" PRIu64
           " pending parts",
           lines, count, o->records, bad, short_keys, pending);
  return ok;
}

typedef struct window_check {
  uint64_t expected, lines, lost, duplicated, out_of_order, wrong_sums,
      pending, malformed;
} window_check;

/* Check the window job's committed files against the closed form: key k
 * has c_k = records / keys (+1 for k < records % keys) records, whose j-th
 * has value j * keys + k; window w holds j = wW .. wW+W-1, so its sum is
 * keys * W * (2wW + W - 1) / 2 + W * k.  Every full window must appear
 * once, in order within its instance's files, with that sum. */
static window_check check_windows(const options *o) {
  window_check c = {0};
  uint64_t W = o->window, K = o->keys;
  uint64_t full = o->records / K, rest = o->records % K;
  uint64_t *next = calloc(K, sizeof *next);
  char **names = 0;
  size_t count = 0;
  if (next) /* a directory that cannot be read leaves every window lost */
    (void)list_parts(o->output_dir, &names, &count, &c.pending);
  for (size_t i = 0; i < count; i++) {
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", o->output_dir, names[i]);
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
      unsigned long long k, w, s;
      c.lines++;
      if (sscanf(line, "%llu,%llu,%llu", &k, &w, &s) != 3 || k >= K) {
        c.malformed++;
        continue;
      }
      if (w < next[k]) {
        c.duplicated++;
        continue;
      }
      if (w > next[k])
        c.out_of_order++;
      uint64_t sum = K * (W * (2 * w * W + W - 1) / 2) + W * k;
      c.wrong_sums += s != sum;
      next[k] = w + 1;
    }
    if (f)
      fclose(f);
    free(names[i]);
  }
  free(names);
  for (uint64_t k = 0; k < K && next; k++) {
    uint64_t windows = (full + (k < rest)) / W;
    c.expected += windows;
    c.lost += windows > next[k] ? windows - next[k] : 0;
  }
  if (!next)
    c.malformed = UINT64_MAX;
  free(next);
  return c;
}

/* The expected checksum, computed without the engine. */
bool verify_checksum(const options *o, const sl_checksum *got, char *why,
                     size_t why_size) {
  uint64_t records = 0, value_sum = 0;
  if (strcmp(o->job_name, "pipeline") == 0) {
    /* v = 3i+1 is a multiple of 4 exactly when i % 4 == 1. */
    for (uint64_t i = 0; i < o->records; i++) {
      uint64_t v = 3 * i + 1;
      if (v % 4 != 0) {
        records++;
        value_sum += v;
      }
    }
  } else {
    /* Key k occurs c_k times; its running counts sum to c_k (c_k + 1) / 2. */
    records = o->records;
    uint64_t full = o->records / o->keys, rest = o->records % o->keys;
    for (uint64_t k = 0; k < o->keys && k < o->records; k++) {
      uint64_t c = full + (k < rest);
      value_sum += c * (c + 1) / 2;
    }
  }
  if (got->records != records || got->value_sum != value_sum) {
    snprintf(why, why_size,
             "sink saw %" PRIu64 " records with value sum %" PRIu64
             ", expected %" PRIu64 " and %" PRIu64,
             got->records, got->value_sum, records, value_sum);
    return false;
  }
  snprintf(why, why_size, "%" PRIu64 " records, value sum %" PRIu64, records,
           value_sum);
  return true;
}

/* The window job's verdict: the committed files against the closed form,
 * and the verifying sink's counts (restored with the state, so they are
 * about the committed run). */
bool window_verdict(const options *o, const sl_op *verify_op, char *why,
                    size_t why_size) {
  window_check c = check_windows(o);
  sl_verify_counts v = {0};
  sl_verify_result(verify_op, &v);
  bool exactly = o->config.checkpoint.mode == SL_EXACTLY_ONCE;
  bool files_ok = c.malformed == 0 && c.lost == 0 && c.wrong_sums == 0 &&
                  (exactly ? c.duplicated == 0 && c.out_of_order == 0 &&
                                 c.pending == 0 && c.lines == c.expected
                           : true);
  bool sink_ok = v.complete && v.lost == 0 &&
                 (exactly ? v.duplicates == 0 && v.out_of_order == 0 : true);
  snprintf(why, why_size,
           "%s: committed %" PRIu64 " windows of %" PRIu64 " expected, %"
           PRIu64 " lost, %" PRIu64 " duplicated, %" PRIu64 " out of order, %"
           PRIu64 " wrong sums, %" PRIu64 " malformed, %" PRIu64
           " uncommitted parts; verifying sink: %" PRIu64 " records, %" PRIu64
           " lost, %" PRIu64 " duplicates, %" PRIu64 " out of order",
           files_ok && sink_ok ? (exactly ? "EXACTLY-ONCE" : "AT-LEAST-ONCE")
                               : "VIOLATED",
           c.lines, c.expected, c.lost, c.duplicated, c.out_of_order,
           c.wrong_sums, c.malformed, c.pending, v.records, v.lost,
           v.duplicates, v.out_of_order);
  return files_ok && sink_ok;
}
