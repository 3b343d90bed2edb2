/* replay.c — a main() for the fuzz targets in ordinary builds: calls a
 * target's LLVMFuzzerInitialize (if it has one) and then
 * LLVMFuzzerTestOneInput once per file of the directories and files on
 * the command line.  So the seed corpora run through the same harnesses
 * in every build of the test suite (gcc, ASan), and a harness that no
 * longer compiles against the code shows up there, not only under clang.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

#define REPLAY_MAX_FILES 10000 /* per directory: a seed corpus is small */

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return 1;
  }
  uint8_t *data = 0;
  size_t size = 0, capacity = 0;
  for (;;) {
    if (size == capacity) {
      capacity = capacity ? 2 * capacity : 4096;
      uint8_t *bigger = realloc(data, capacity);
      if (!bigger)
        abort();
      data = bigger;
    }
    size_t n = fread(data + size, 1, capacity - size, f);
    size += n;
    if (n == 0)
      break;
  }
  fclose(f);
  /* An exact copy: a read past the input's end is a heap overflow. */
  uint8_t *exact = malloc(size ? size : 1);
  if (!exact)
    abort();
  memcpy(exact, data, size);
  free(data);
  LLVMFuzzerTestOneInput(exact, size);
  free(exact);
  return 0;
}

static int replay_dir(const char *dir, int *count) {
  DIR *d = opendir(dir);
  if (!d)
    return replay_file(dir) == 0 ? (++*count, 0) : 1;
  int failed = 0, files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != 0 && files < REPLAY_MAX_FILES) {
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >=
            (int)sizeof path ||
        stat(path, &st) != 0 || !S_ISREG(st.st_mode))
      continue;
    failed |= replay_file(path);
    files++;
  }
  closedir(d);
  *count += files;
  return failed;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  int failed = 0, count = 0;
  for (int i = 1; i < argc; i++)
    failed |= replay_dir(argv[i], &count);
  printf("replayed %d inputs\n", count);
  return failed || count == 0;
}
