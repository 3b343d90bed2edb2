/* fuzz_io.h — the schema the CSV and JSON lines targets parse against,
 * and the checks of a parsed record (io_parse.c's contract): one field of
 * every type, a timestamp, an optional field and strings at their limit.
 */
#ifndef SL_FUZZ_IO_H
#define SL_FUZZ_IO_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fuzz_lines.h"
#include "io_internal.h"
#include "sluice_io.h"

typedef struct fuzz_row {
  int64_t ts;
  int32_t qty;
  double price;
  uint8_t ok;
  char sym[8];
  char note[4]; /* optional */
} fuzz_row;

static const sl_field fuzz_fields[] = {
    SL_FIELD(fuzz_row, ts, SL_FIELD_INT64),
    SL_FIELD(fuzz_row, qty, SL_FIELD_INT32),
    SL_FIELD(fuzz_row, price, SL_FIELD_DOUBLE),
    SL_FIELD(fuzz_row, ok, SL_FIELD_BOOL),
    SL_FIELD(fuzz_row, sym, SL_FIELD_STRING),
    SL_FIELD_OPT(fuzz_row, note, SL_FIELD_STRING),
};

static const sl_schema fuzz_schema = {
    .fields = fuzz_fields,
    .field_count = (int)(sizeof fuzz_fields / sizeof fuzz_fields[0]),
    .record_bytes = sizeof(fuzz_row),
    .timestamp_field = "ts",
};

/* The schema copy every run uses (made once: io_schema_copy validates). */
static inline const io_schema *fuzz_io_schema(void) {
  static io_schema *copy;
  if (!copy) {
    char err[256];
    if (io_schema_copy(&fuzz_schema, &copy, err, sizeof err) != 0) {
      fprintf(stderr, "fuzz schema: %s\n", err);
      abort();
    }
  }
  return copy;
}

/* A string field ends in NUL bytes up to its end (sluice_io.h). */
static inline bool fuzz_string_ok(const char *s, size_t size) {
  const char *nul = memchr(s, 0, size);
  if (!nul)
    return false;
  for (const char *p = nul; p < s + size; p++)
    if (*p)
      return false;
  return true;
}

/* What io_parse_line() promises: a parsed record has a timestamp that is
 * not SL_NO_TIMESTAMP, equal to its ts field, a boolean of 0 or 1 and
 * NUL-padded strings; a malformed line has a non-empty reason that fits
 * its buffer. */
static inline void fuzz_io_check(int rc, const fuzz_row *row, int64_t ts,
                                 const char *reason, size_t reason_bytes) {
  FUZZ_CHECK(rc == IO_PARSED || rc == IO_MALFORMED);
  if (rc == IO_MALFORMED) {
    FUZZ_CHECK(reason[0] != 0);
    FUZZ_CHECK(memchr(reason, 0, reason_bytes) != 0);
    return;
  }
  FUZZ_CHECK(ts != SL_NO_TIMESTAMP);
  FUZZ_CHECK(ts == row->ts);
  FUZZ_CHECK(row->ok == 0 || row->ok == 1);
  FUZZ_CHECK(fuzz_string_ok(row->sym, sizeof row->sym));
  FUZZ_CHECK(fuzz_string_ok(row->note, sizeof row->note));
}

#endif /* SL_FUZZ_IO_H */
