/* stress_check.h — the CHECK macro of the plain-C stress programs (they
 * run under ThreadSanitizer, where Criterion aborts): a failed check prints
 * where and why and counts; main() exits 1 if any failed. */
#ifndef SL_STRESS_CHECK_H
#define SL_STRESS_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                     \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#endif /* SL_STRESS_CHECK_H */
