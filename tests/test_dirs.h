/* test_dirs.h — temporary directories for the Criterion suites: a fresh
 * directory per test (mkdtemp), paths inside it, and removal.  Failures
 * fail the test that asked. */
#ifndef SL_TEST_DIRS_H
#define SL_TEST_DIRS_H

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new directory /tmp/sluice-TAG-XXXXXX (free it with
 * sl_test_remove_tree). */
static inline char *sl_test_temp_dir(const char *tag) {
  char *dir = malloc(strlen(tag) + 32);
  cr_assert(dir);
  sprintf(dir, "/tmp/sluice-%s-XXXXXX", tag);
  cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
  return dir;
}

/* rm -rf dir, then free(dir). */
static inline void sl_test_remove_tree(char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
  free(dir);
}

/* dir/name, malloc'd. */
static inline char *sl_test_path_in(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  cr_assert(p);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

/* The whole file at path, malloc'd and NUL-terminated, and its size in
 * *size (size may be NULL); NULL if it cannot be opened. */
static inline char *sl_test_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  cr_assert_eq(fseek(f, 0, SEEK_END), 0);
  long n = ftell(f);
  cr_assert(n >= 0, "%s: ftell: %s", path, strerror(errno));
  cr_assert_eq(fseek(f, 0, SEEK_SET), 0);
  char *data = malloc((size_t)n + 1);
  cr_assert(data);
  cr_assert_eq(fread(data, 1, (size_t)n, f), (size_t)n);
  data[n] = 0;
  fclose(f);
  if (size)
    *size = (size_t)n;
  return data;
}

/* sl_test_read_file of a file that must exist. */
static inline char *sl_test_slurp(const char *path) {
  char *data = sl_test_read_file(path, NULL);
  cr_assert(data, "%s: %s", path, strerror(errno));
  return data;
}

#endif /* SL_TEST_DIRS_H */
