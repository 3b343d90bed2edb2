/* http.h — internal pieces of the HTTP endpoint: where a POST /savepoints
 * may write (http_savepoint.c), for http.c and for tests and fuzz targets
 * that drive the name rules without a server. */
#ifndef SL_HTTP_H
#define SL_HTTP_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

/* The longest savepoint name a request may give, and its most components:
 * bounds for the walk in sl_http_savepoint_target (http.c note 5). */
#define SL_HTTP_SAVEPOINT_NAME_MAX 1024u
#define SL_HTTP_SAVEPOINT_DEPTH_MAX 16u

/* The absolute form of path without symbolic links (realpath), or, when
 * path does not exist yet, its absolute lexical form.  false (errno set)
 * when neither fits in out. */
bool sl_http_canonical_path(const char *path, char *out, size_t out_bytes);

/* Whether path is dir or lies below it; both canonical. */
bool sl_http_path_inside(const char *path, const char *dir);

/* The absolute path of a new savepoint named name (name_bytes bytes, not
 * necessarily NUL-terminated, from a request) below root (canonical, an
 * existing directory), into out.  Intermediate directories are created
 * below root, each opened with O_NOFOLLOW from its parent.  Refused:
 * empty or too long names (400), NUL and control bytes, absolute names not
 * below root, empty, "." and ".." components, a symbolic link or a file on
 * the way, and targets inside protected[0 .. protected_count-1] (all
 * canonical) (403), a final component that exists and is no directory
 * (409).  Returns 0, or the HTTP status with a message in why.  A refused
 * name creates nothing: a component can only be refused while it exists,
 * and every one after a created directory is new. */
unsigned sl_http_savepoint_target(const char *root, const char *const *protected,
                                  size_t protected_count, const char *name,
                                  size_t name_bytes, char *out,
                                  size_t out_bytes, char *why,
                                  size_t why_bytes);

#endif /* SL_HTTP_H */
