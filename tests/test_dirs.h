/* test_dirs.h — temporary directories for the Criterion suites: a fresh
 * directory per test (mkdtemp), paths inside it, and removal.  Failures
 * fail the test that asked.
 *
 * Removal walks the tree in this process (nftw) rather than running
 * `rm -rf` through system(): a shell and an rm per call cost milliseconds
 * each, and some tests remove hundreds of directories. */
#ifndef SL_TEST_DIRS_H
#define SL_TEST_DIRS_H

#include <criterion/criterion.h>
#include <errno.h>
#include <ftw.h>
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

/* nftw's callback for sl_test_remove_path: the walk is depth first
 * (FTW_DEPTH), so a directory comes after everything in it and is empty
 * by then.  An entry already gone is no failure; any other stops the walk
 * with its errno. */
static inline int sl_test_remove_entry(const char *path,
                                       const struct stat *status, int type,
                                       struct FTW *where) {
  (void)status, (void)type, (void)where;
  if (remove(path) != 0 && errno != ENOENT)
    return errno;
  return 0;
}

/* What `rm -rf path` does, in this process: path and everything under it
 * is removed; symbolic links are removed, never followed (FTW_PHYS).  A
 * path that does not exist is no failure.
 * Returns 0 or the errno of the first entry that could not be removed
 * (the entries before it are gone). */
static inline int sl_test_remove_path(const char *path) {
  /* 16: the descriptors nftw may hold open at once; deeper trees are
   * walked all the same. */
  int rc = nftw(path, sl_test_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  if (rc == -1)
    return errno == ENOENT ? 0 : errno;
  return rc;
}

/* rm -rf dir (sl_test_remove_path), then free(dir). */
static inline void sl_test_remove_tree(char *dir) {
  int rc = sl_test_remove_path(dir);
  cr_assert_eq(rc, 0, "cannot remove %s: %s", dir, strerror(rc));
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
