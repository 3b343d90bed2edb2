/* fuzz_csv.c — libFuzzer target: the CSV parser of the file and stdin
 * sources (operators/io_parse.c: io_parse_header and io_parse_line with
 * SL_FORMAT_CSV and SL_FORMAT_CSV_HEADER) against the schema of fuzz_io.h.
 *
 * Input: one byte choosing the format (bit 0: a header) and the delimiter
 * (bits 1-2: ',' ';' '\t' '|'), then the lines.  With a header the first
 * line is the header, as in a file; a header refused makes the file
 * unreadable, so the run ends there as the source does.
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_io.h"

typedef struct run {
  io_parser parser;
} run;

static int parse_one(void *arg, const char *line, size_t bytes) {
  run *r = arg;
  char reason[IO_REASON_BYTES] = "";
  if (io_parser_wants_header(&r->parser)) {
    int rc = io_parse_header(&r->parser, line, bytes, reason, sizeof reason);
    FUZZ_CHECK(rc == 0 || rc == IO_MALFORMED || rc == ENOMEM);
    FUZZ_CHECK(rc != IO_MALFORMED || reason[0] != 0);
    FUZZ_CHECK(rc != 0 || !io_parser_wants_header(&r->parser));
    return rc; /* the source stops reading a file whose header is bad */
  }
  fuzz_row row;
  int64_t ts = 0;
  int rc = io_parse_line(&r->parser, line, bytes, &row, &ts, reason,
                         sizeof reason);
  if (rc == ENOMEM)
    return 0;
  fuzz_io_check(rc, &row, ts, reason, sizeof reason);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char delimiters[4] = {',', ';', '\t', '|'};
  if (size < 1)
    return 0;
  int format = data[0] & 1 ? SL_FORMAT_CSV_HEADER : SL_FORMAT_CSV;
  char delimiter = delimiters[(data[0] >> 1) & 3];
  run r = {0};
  if (io_parser_init(&r.parser, fuzz_io_schema(), format, delimiter) != 0)
    return 0;
  fuzz_each_line(data + 1, size - 1, parse_one, &r);
  io_parser_free(&r.parser);
  return 0;
}
