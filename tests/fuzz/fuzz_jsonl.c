/* fuzz_jsonl.c — libFuzzer target: the JSON lines parser of the file and
 * stdin sources (operators/io_parse.c, io_parse_line with SL_FORMAT_JSONL)
 * over every line of the input, against the schema of fuzz_io.h.
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_io.h"

static int parse_one(void *arg, const char *line, size_t bytes) {
  io_parser *parser = arg;
  fuzz_row row;
  int64_t ts = 0;
  char reason[IO_REASON_BYTES] = "";
  int rc = io_parse_line(parser, line, bytes, &row, &ts, reason,
                         sizeof reason);
  if (rc == ENOMEM)
    return 0; /* -rss_limit_mb / -malloc_limit_mb: not a finding */
  fuzz_io_check(rc, &row, ts, reason, sizeof reason);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  io_parser parser;
  if (io_parser_init(&parser, fuzz_io_schema(), SL_FORMAT_JSONL, 0) != 0)
    return 0;
  fuzz_each_line(data, size, parse_one, &parser);
  io_parser_free(&parser);
  return 0;
}
