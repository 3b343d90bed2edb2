/* output_dir.c — the lineage marker of a transactional file sink's output
 * directory and commits that never replace a part (design notes in
 * output_dir.h). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "output_dir.h"
#include "sluice.h"

/* Scanning a directory stops after this many entries: an output directory
 * holds a few files per instance and checkpoint, far fewer. */
#define OUTPUT_DIR_MAX_ENTRIES 100000000u

uint64_t sl_output_new_lineage(void) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    /* No entropy yet (early boot): time and pid still differ between
     * runs, which is all a lineage id must do. */
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    id = (uint64_t)t.tv_sec * 1000000007u ^ (uint64_t)t.tv_nsec << 20 ^
         (uint64_t)getpid();
  }
  return id ? id : 1; /* 0 means "none" in the sink's state */
}

static void marker_path(const char *dir, char *path, size_t bytes) {
  snprintf(path, bytes, "%s/" SL_OUTPUT_LINEAGE_FILE, dir);
}

/* Read dir's marker.  Returns 0 with *lineage, ENOENT (no marker),
 * SL_ECORRUPT (not a marker: err names it) or an errno value. */
static int read_marker(const char *dir, uint64_t *lineage, char *err,
                       size_t err_bytes) {
  char path[4200];
  marker_path(dir, path, sizeof path);
  FILE *f = fopen(path, "r");
  if (!f) {
    int e = errno; /* before snprintf, which may change errno */
    if (e != ENOENT)
      snprintf(err, err_bytes, "cannot read %s: %s", path, strerror(e));
    return e;
  }
  char line[64] = "";
  bool got = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  unsigned long long id = 0;
  int end = 0;
  if (!got || sscanf(line, "sluice-lineage %16llx%n", &id, &end) != 1 ||
      end != 31 || (line[end] != '\n' && line[end] != 0) || id == 0) {
    snprintf(err, err_bytes, "%s is not a lineage marker (expected "
             "\"sluice-lineage\" and 16 hex digits)", path);
    return SL_ECORRUPT;
  }
  *lineage = id;
  return 0;
}

/* fsync the directory dir, so renames and unlinks in it are durable.
 * Returns 0 or an errno value. */
int sl_output_sync_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    return errno;
  int rc = fsync(fd) == 0 ? 0 : errno;
  close(fd);
  return rc;
}

/* Note 5: write dir's marker through a temporary file and a rename. */
static int write_marker(const char *dir, uint64_t lineage, char *err,
                        size_t err_bytes) {
  char path[4200], tmp[4300];
  marker_path(dir, path, sizeof path);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int rc = f ? 0 : errno;
  if (f) {
    if (fprintf(f, "sluice-lineage %016" PRIx64 "\n", lineage) < 0 ||
        fflush(f) != 0 || fsync(fileno(f)) != 0)
      rc = errno ? errno : EIO;
    if (fclose(f) != 0 && rc == 0)
      rc = errno;
  }
  if (rc == 0 && rename(tmp, path) != 0)
    rc = errno;
  if (rc == 0)
    rc = sl_output_sync_dir(dir);
  if (rc) {
    unlink(tmp);
    snprintf(err, err_bytes, "cannot write %s: %s", path, strerror(rc));
  }
  return rc;
}

static bool is_committed(const char *name) {
  return strncmp(name, "part-", 5) == 0;
}

static bool is_pending(const char *name) {
  return strncmp(name, ".part-", 6) == 0;
}

/* The first committed part of dir into first (or "" if none); with clear,
 * delete every part file instead (committed and pending).  Returns 0 or an
 * errno value. */
static int scan_parts(const char *dir, bool clear, char *first,
                      size_t first_bytes, char *err, size_t err_bytes) {
  first[0] = 0;
  DIR *d = opendir(dir);
  if (!d) {
    snprintf(err, err_bytes, "cannot read directory %s: %s", dir,
             strerror(errno));
    return errno;
  }
  int rc = 0;
  struct dirent *e;
  for (uint32_t n = 0; rc == 0 && n < OUTPUT_DIR_MAX_ENTRIES &&
                       (e = readdir(d)); n++) {
    if (!is_committed(e->d_name) && !(clear && is_pending(e->d_name)))
      continue;
    if (!clear) {
      snprintf(first, first_bytes, "%s", e->d_name);
      break;
    }
    char path[4096 + 256 + 2];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (unlink(path) != 0 && errno != ENOENT) {
      rc = errno;
      snprintf(err, err_bytes, "cannot delete %s: %s", path, strerror(rc));
    }
  }
  closedir(d);
  if (rc == 0 && clear)
    rc = sl_output_sync_dir(dir);
  return rc;
}

int sl_output_claim(const char *dir, uint64_t lineage, bool clear,
                    char *err, size_t err_bytes) {
  uint64_t owner = 0;
  int rc = read_marker(dir, &owner, err, err_bytes);
  if (rc == 0 && owner == lineage)
    return 0; /* a restart of this run before its first checkpoint */
  if (rc != 0 && rc != ENOENT && rc != SL_ECORRUPT)
    return rc;
  char first[256];
  rc = scan_parts(dir, false, first, sizeof first, err, err_bytes);
  if (rc)
    return rc;
  if (first[0] && !clear) {
    char whose[64] = "written without a lineage marker";
    if (owner)
      snprintf(whose, sizeof whose, "of job lineage %016" PRIx64, owner);
    snprintf(err, err_bytes,
             "output directory %s holds %s %s, another run's output: "
             "resume that run, use another directory, or start fresh to "
             "delete it (--fresh)", dir, first, whose);
    return EEXIST;
  }
  /* No committed part, or clearing them: the pending parts go too (no
   * checkpoint of this lineage refers to them: note 2). */
  rc = scan_parts(dir, true, first, sizeof first, err, err_bytes);
  if (rc)
    return rc;
  return write_marker(dir, lineage, err, err_bytes);
}

int sl_output_check_restored(const char *dir, uint64_t *lineage,
                             uint64_t fallback, uint64_t checkpoint_id,
                             char *err, size_t err_bytes) {
  uint64_t owner = 0;
  int rc = read_marker(dir, &owner, err, err_bytes);
  if (rc != 0 && rc != ENOENT)
    return rc;
  if (*lineage == 0) /* state saved before lineages: adopt */
    *lineage = rc == 0 ? owner : fallback;
  if (rc == ENOENT)
    return write_marker(dir, *lineage, err, err_bytes);
  if (owner != *lineage) {
    snprintf(err, err_bytes,
             "output directory %s belongs to job lineage %016" PRIx64
             " (" SL_OUTPUT_LINEAGE_FILE "), but checkpoint %" PRIu64
             " is of lineage %016" PRIx64 ": another run has written "
             "there since; use another directory", dir, owner,
             checkpoint_id, *lineage);
    return EEXIST;
  }
  return 0;
}

/* Both names are one file: a link done and its unlink not (note 4). */
static bool same_file(const char *a, const char *b) {
  struct stat sa, sb;
  return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

int sl_output_commit(const char *from, const char *to, bool restoring) {
  if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0)
    return 0;
  int e = errno;
  if (e == EINVAL || e == ENOSYS) {
    /* The file system lacks RENAME_NOREPLACE: link fails on an existing
     * target just the same; a crash between the two leaves both names,
     * which the restore below finishes. */
    if (link(from, to) == 0)
      return unlink(from) == 0 || errno == ENOENT ? 0 : errno;
    e = errno;
  }
  if (e == EEXIST && restoring && same_file(from, to))
    return unlink(from) == 0 ? 0 : errno;
  return e;
}
