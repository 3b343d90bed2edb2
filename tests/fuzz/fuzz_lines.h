/* fuzz_lines.h — what the line-parser fuzz targets share: the input cut
 * into lines the way operators/io_reader.c cuts a file (at '\n', a '\r'
 * before it dropped, empty lines skipped), each line handed over in a heap
 * block of exactly its length so AddressSanitizer sees a read one byte
 * past its end.  Header-only: each target is one program.
 */
#ifndef SL_FUZZ_LINES_H
#define SL_FUZZ_LINES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lines parsed per input, at most: a bound on the work of one run, far
 * above what -max_len lets through anyway. */
#define FUZZ_MAX_LINES 4096

typedef int (*fuzz_line_fn)(void *arg, const char *line, size_t bytes);

/* Calls fn for each non-empty line of data (at most FUZZ_MAX_LINES);
 * stops early when fn returns non-zero and returns that, else 0. */
static inline int fuzz_each_line(const uint8_t *data, size_t size,
                                 fuzz_line_fn fn, void *arg) {
  size_t at = 0;
  for (int n = 0; n < FUZZ_MAX_LINES && at < size; n++) {
    const uint8_t *nl = memchr(data + at, '\n', size - at);
    size_t end = nl ? (size_t)(nl - data) : size;
    size_t bytes = end - at;
    if (nl && bytes > 0 && data[end - 1] == '\r')
      bytes--; /* io_reader.c drops the '\r' of a "\r\n" */
    int rc = 0;
    if (bytes > 0) {
      char *line = malloc(bytes); /* exactly: no NUL after it */
      if (!line)
        abort();
      memcpy(line, data + at, bytes);
      rc = fn(arg, line, bytes);
      free(line);
    }
    if (rc)
      return rc;
    at = end + 1;
  }
  return 0;
}

/* Aborts with a message when cond is false: a broken contract is a crash
 * libFuzzer keeps the input of, in every build type. */
#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: contract broken: %s\n", __FILE__, __LINE__,   \
              #cond);                                                        \
      abort();                                                               \
    }                                                                        \
  } while (0)

#endif /* SL_FUZZ_LINES_H */
