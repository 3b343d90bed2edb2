/* http_savepoint.c — where POST /savepoints may write (http.c note 5):
 * a request's name becomes a path below the savepoint root, or a refusal
 * that says why.
 *
 * NOTES
 *
 * 1. The checks are lexical first (NUL, control bytes, absolute names,
 *    empty, "." and ".." components, the protected directories), then on
 *    the file system: the walk opens every component with O_NOFOLLOW from
 *    the directory before it, so a symbolic link anywhere below the root
 *    is refused, whether it points in or out.  Since no link is followed
 *    and no ".." is allowed, root + "/" + name is the canonical path of the
 *    target, and the lexical check against the canonical protected
 *    directories is exact.
 * 2. What remains open is a race with someone who can write below the
 *    root: a component replaced by a link between this walk and
 *    sl_job_savepoint's own mkdir and open.  The root must be writable by
 *    the job's user only; remote clients cannot create links.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http.h"

#define DIR_MODE 0777 /* less the umask, as sl_job_savepoint makes them */

static unsigned refuse(char *why, size_t why_bytes, unsigned status,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static unsigned refuse(char *why, size_t why_bytes, unsigned status,
                       const char *fmt, ...) {
  assert(status >= 400 && status < 600);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, why_bytes, fmt, ap);
  va_end(ap);
  return status;
}

bool sl_http_canonical_path(const char *path, char *out, size_t out_bytes) {
  assert(path && out && out_bytes >= PATH_MAX);
  if (realpath(path, out))
    return true;
  if (errno != ENOENT)
    return false;
  if (path[0] == '/') {
    if (strlen(path) >= out_bytes)
      return errno = ENAMETOOLONG, false;
    strcpy(out, path);
    return true;
  }
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd))
    return false;
  if ((size_t)snprintf(out, out_bytes, "%s/%s", cwd, path) >= out_bytes)
    return errno = ENAMETOOLONG, false;
  return true;
}

bool sl_http_path_inside(const char *path, const char *dir) {
  assert(path[0] == '/' && dir[0] == '/');
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/')
    n--; /* "/a/" is "/a"; "/" stays */
  if (n == 1)
    return true; /* everything is below "/" */
  return strncmp(path, dir, n) == 0 && (path[n] == 0 || path[n] == '/');
}

/* Note 1, the lexical part: name (NUL-free, relative) split at '/' into
 * parts[]; 0 or a refusal. */
static unsigned split_name(char *name, char **parts, size_t *count,
                           char *why, size_t why_bytes) {
  size_t n = 0;
  for (char *p = name;; n++) {
    if (n == SL_HTTP_SAVEPOINT_DEPTH_MAX)
      return refuse(why, why_bytes, 400, "more than %u path components",
                    SL_HTTP_SAVEPOINT_DEPTH_MAX);
    char *slash = strchr(p, '/');
    if (slash)
      *slash = 0;
    if (!*p)
      return refuse(why, why_bytes, 403, "an empty path component");
    if (strcmp(p, ".") == 0 || strcmp(p, "..") == 0)
      return refuse(why, why_bytes, 403, "a \"%s\" path component", p);
    if (strlen(p) > NAME_MAX)
      return refuse(why, why_bytes, 400, "a path component over %d bytes",
                    NAME_MAX);
    parts[n] = p;
    if (!slash)
      break;
    p = slash + 1;
  }
  *count = n + 1;
  return 0;
}

/* Note 1, the file-system part: open parts[0 .. count-2] below root with
 * O_NOFOLLOW (creating missing ones), then look at the last.  0 or a
 * refusal. */
static unsigned walk(const char *root, char **parts, size_t count, char *why,
                     size_t why_bytes) {
  assert(count >= 1 && count <= SL_HTTP_SAVEPOINT_DEPTH_MAX);
  int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return refuse(why, why_bytes, 500, "cannot open the savepoint root %s: %s",
                  root, strerror(errno));
  unsigned status = 0;
  for (size_t i = 0; i + 1 < count && !status; i++) {
    int flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    int next = openat(fd, parts[i], flags);
    if (next < 0 && errno == ENOENT &&
        (mkdirat(fd, parts[i], DIR_MODE) == 0 || errno == EEXIST))
      next = openat(fd, parts[i], flags);
    if (next < 0)
      status = errno == ELOOP || errno == ENOTDIR
                   ? refuse(why, why_bytes, 403, "\"%s\" is a symbolic link "
                            "or not a directory", parts[i])
                   : refuse(why, why_bytes, 500, "cannot open \"%s\": %s",
                            parts[i], strerror(errno));
    close(fd);
    fd = next;
  }
  if (!status) {
    struct stat st;
    const char *last = parts[count - 1];
    if (fstatat(fd, last, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT)
        status = refuse(why, why_bytes, 500, "cannot look at \"%s\": %s",
                        last, strerror(errno));
    } else if (S_ISLNK(st.st_mode)) {
      status = refuse(why, why_bytes, 403, "\"%s\" is a symbolic link", last);
    } else if (!S_ISDIR(st.st_mode)) {
      status = refuse(why, why_bytes, 409, "\"%s\" exists and is not a "
                      "directory", last);
    }
  }
  if (fd >= 0)
    close(fd);
  return status;
}

unsigned sl_http_savepoint_target(const char *root, const char *const *protected,
                                  size_t protected_count, const char *name,
                                  size_t name_bytes, char *out,
                                  size_t out_bytes, char *why,
                                  size_t why_bytes) {
  assert(root && root[0] == '/' && name && out && why);
  if (name_bytes == 0)
    return refuse(why, why_bytes, 400, "an empty savepoint name");
  if (name_bytes > SL_HTTP_SAVEPOINT_NAME_MAX)
    return refuse(why, why_bytes, 400, "a savepoint name over %u bytes",
                  SL_HTTP_SAVEPOINT_NAME_MAX);
  for (size_t i = 0; i < name_bytes; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
      return refuse(why, why_bytes, 403, "a %s byte (0x%02x) at offset %zu",
                    name[i] ? "control" : "NUL", (unsigned)name[i], i);
  char copy[SL_HTTP_SAVEPOINT_NAME_MAX + 1];
  memcpy(copy, name, name_bytes);
  copy[name_bytes] = 0;
  char *relative = copy;
  size_t root_bytes = strlen(root);
  if (copy[0] == '/') { /* absolute: only below the root */
    bool below = strncmp(copy, root, root_bytes) == 0 &&
                 copy[root_bytes] == '/' && root_bytes > 1;
    if (!below)
      return refuse(why, why_bytes, 403, "an absolute path outside the "
                    "savepoint root %s", root);
    relative = copy + root_bytes + 1;
  }
  char *parts[SL_HTTP_SAVEPOINT_DEPTH_MAX];
  size_t count = 0;
  char joined[SL_HTTP_SAVEPOINT_NAME_MAX + 1];
  snprintf(joined, sizeof joined, "%s", relative); /* split_name cuts it */
  unsigned status = split_name(relative, parts, &count, why, why_bytes);
  if (status)
    return status;
  if ((size_t)snprintf(out, out_bytes, "%s/%s", root, joined) >= out_bytes)
    return refuse(why, why_bytes, 400, "the savepoint path is too long");
  for (size_t i = 0; i < protected_count; i++)
    if (sl_http_path_inside(out, protected[i]))
      return refuse(why, why_bytes, 403, "%s lies inside %s, which belongs "
                    "to the job", out, protected[i]);
  return walk(root, parts, count, why, why_bytes);
}
