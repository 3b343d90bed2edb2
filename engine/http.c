/* http.c — the embedded HTTP endpoint of a job (sluice.h, "HTTP
 * endpoint"): Prometheus text on /metrics, JSON on /jobs and /checkpoints,
 * savepoints on POST /savepoints, a stop with a savepoint on POST /stop;
 * libmicrohttpd serves it.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The engine is read only through sl_job_metrics() (metrics.c): relaxed
 *    loads and one lock the coordinator holds for a copy at a time.  No
 *    handler takes a lock an instance thread takes, so a slow or stuck
 *    client never slows the job.
 * 2. libmicrohttpd runs a listening thread and one thread per connection.
 *    A savepoint request, which lasts as long as the savepoint, does not
 *    hold up a scrape of /metrics.  Savepoint requests are served one at a
 *    time (savepoint_lock).
 * 3. A request is answered once its body has been read (at most
 *    HTTP_BODY_MAX bytes).  Routing: a known path with another method gets
 *    405 and an Allow header, an unknown path 404, a bad parameter 400;
 *    every error body is JSON {"error": "..."}.
 * 4. The documents come from exposition.c; error bodies and the
 *    savepoint answer are built with jansson too, so user text (paths,
 *    failure messages) is always escaped.
 * 5. Savepoints go below the savepoint root only (http_savepoint.c):
 *    without a root POST /savepoints gets 403, as the alternative, any
 *    path the process may write, lets any client that reaches the port
 *    fill a disk or overwrite a directory with a copy of the store.
 * 6. Cross-site requests (CSRF and DNS rebinding): a browser lets any page
 *    send a "simple" POST (form content types) to 127.0.0.1 without asking
 *    first, so those types get 403 and the answer is never a savepoint.
 *    Browsers send Origin on every cross-origin request and on every POST,
 *    so an Origin other than this endpoint (http://ADDR:PORT of the address
 *    the client reached, or localhost on loopback) gets 403.  A page whose
 *    name was rebound to 127.0.0.1 is same-origin for the browser; on a
 *    loopback address its Host names another host, so that gets 403 too.
 * 7. A non-loopback address is reachable from other machines, so it needs
 *    a bearer token (sl_http_start_with refuses with SL_EUSAGE without
 *    one); with a token, every request is checked first (401 before any
 *    other answer), in time that does not depend on where the token
 *    differs (token_equal).
 * 8. Slow clients.  Each connection holds a thread, so the server caps
 *    them: HTTP_CONNECTIONS_MAX in all (threads and memory stay bounded)
 *    and HTTP_CLIENT_CONNECTIONS_MAX per client address (one client
 *    cannot take every slot; libmicrohttpd closes the excess at once).
 *    A client must send its whole request within the header timeout from
 *    connecting or from its previous answer: the reaper thread shuts the
 *    socket down at that deadline, also for a client that trickles bytes
 *    and so never lets the idle timeout (HTTP_IDLE_TIMEOUT_S, for slow
 *    readers of an answer) expire.  The deadline is off while a request is
 *    being answered, so a long savepoint is not cut.
 * 9. A Content-Length over HTTP_BODY_MAX gets 413 when the headers are in,
 *    before any of the body is read (and libmicrohttpd then closes the
 *    connection); a chunked body that grows past it closes the connection.
 * 10. POST /stop is POST /savepoints whose savepoint then stops the job
 *    (sl_job_stop_with_savepoint): the same name rules below the root
 *    (note 5) and guards (notes 6, 7), plus drain=true|false (query or
 *    JSON body).  The answer comes once the stop is done: a savepoint
 *    without drain, or the job's final checkpoint with drain.
 *
 * Request states (handle_request, per connection; connection_event keeps
 * the client record and its deadline):
 *
 *   new --[headers in: refused()]--> refused (answer queued) --> freed
 *                 |                                            [request_done]
 *                 +--> reading --[body chunks: take_body]--> reading
 *                         |
 *                         +--[final call: dispatch]--> answered --> freed
 *                                                       [request_done]
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "exposition.h"
#include "http.h"
#include "internal.h"

#define HTTP_CONNECTIONS_MAX 64u       /* note 8: threads in all */
#define HTTP_CLIENT_CONNECTIONS_MAX 8u /* note 8: per client address */
#define HTTP_CONNECTIONS_LIMIT 1024u   /* the most an option may ask */
#define HTTP_HEADER_TIMEOUT_MS 5000u   /* note 8: a few seconds */
#define HTTP_TIMEOUT_LIMIT_MS 600000u  /* the most an option may ask */
#define HTTP_IDLE_TIMEOUT_S 30u        /* note 8: slow readers */
#define HTTP_BODY_MAX (64u << 10) /* notes 3, 9: a directory name fits */
#define HTTP_TOKEN_MIN 16u        /* shorter ones can be guessed */
#define HTTP_TOKEN_MAX 1024u
#define HTTP_PROTECTED_MAX 16u    /* state dir + options.protected_dirs */
#define HTTP_REAPER_TICK_MS 1000u /* the reaper's longest sleep */

_Static_assert(HTTP_CLIENT_CONNECTIONS_MAX <= HTTP_CONNECTIONS_MAX,
               "one client cannot have more than all");
_Static_assert(HTTP_CONNECTIONS_MAX <= HTTP_CONNECTIONS_LIMIT, "in range");

/* One connection, for the header deadline (note 8).  In h->clients under
 * h->clients_lock from libmicrohttpd's STARTED notice to its CLOSED one. */
typedef struct client {
  struct client *prev, *next;
  int fd;               /* our dup of the socket: what the reaper shuts */
  uint64_t deadline_ns; /* CLOCK_MONOTONIC; 0 while a request is answered */
} client;

struct sl_http {
  sl_job *job;
  struct MHD_Daemon *daemon;
  int port;
  pthread_mutex_t savepoint_lock; /* note 2 */
  char *savepoint_root;           /* canonical, or NULL (note 5) */
  char *protected_dirs[HTTP_PROTECTED_MAX]; /* options.protected_dirs */
  size_t protected_count;
  char *token; /* note 7; NULL: none */
  size_t token_bytes;
  uint64_t header_timeout_ns; /* note 8 */

  pthread_mutex_t clients_lock; /* clients, client_count, reaper_stop */
  pthread_cond_t clients_cond;  /* wakes the reaper to stop */
  client *clients;
  unsigned client_count;
  bool reaper_stop;
  pthread_t reaper;
};

/* One request being read (note 3). */
typedef struct request {
  char *body;
  size_t body_bytes;
  bool answered; /* refused when its headers came in (begin_request) */
} request;

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ------------------------------------------------------- responses */

/* Queue body (taken over) with status; allow is the Allow header's value
 * (405), or WWW-Authenticate's for a 401, or NULL. */
static enum MHD_Result respond(struct MHD_Connection *conn, unsigned status,
                               const char *content_type, char *body,
                               size_t body_bytes, const char *allow) {
  assert(status >= 200 && status < 600);
  assert(body && strlen(body) == body_bytes); /* text, whole */
  /* MUST_FREE: libmicrohttpd frees body with free() when it is sent. */
  struct MHD_Response *r = MHD_create_response_from_buffer(
      body_bytes, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (allow && status == MHD_HTTP_UNAUTHORIZED) /* note 7 */
    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, allow);
  else if (allow)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
  enum MHD_Result rc = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return rc;
}

/* Send value (a reference is taken over) as the JSON body. */
static enum MHD_Result respond_json(struct MHD_Connection *conn,
                                    unsigned status, json_t *value,
                                    const char *allow) {
  char *text = value ? json_dumps(value, JSON_INDENT(2) | JSON_SORT_KEYS |
                                    JSON_REAL_PRECISION(15)) : 0;
  json_decref(value);
  if (!text) {
    static const char oom[] = "{\"error\": \"out of memory\"}\n";
    char *copy = strdup(oom);
    if (!copy)
      return MHD_NO;
    return respond(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "application/json",
                   copy, strlen(copy), 0);
  }
  size_t n = strlen(text);
  /* A final newline, for people reading it with curl. */
  char *body = realloc(text, n + 2);
  if (!body) {
    free(text);
    return MHD_NO;
  }
  body[n] = '\n';
  body[n + 1] = 0;
  return respond(conn, status, "application/json", body, n + 1, allow);
}

static enum MHD_Result respond_error(struct MHD_Connection *conn,
                                     unsigned status, const char *allow,
                                     const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum MHD_Result respond_error(struct MHD_Connection *conn,
                                     unsigned status, const char *allow,
                                     const char *fmt, ...) {
  char message[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  return respond_json(conn, status, json_pack("{s:s}", "error", message),
                      allow);
}

/* ------------------------------------------------------- routes */

/* A snapshot for a handler, or an error response already queued (*rc). */
static bool snapshot(struct MHD_Connection *conn, const sl_http *h,
                     unsigned flags, sl_metrics *m, enum MHD_Result *rc) {
  int status = sl_job_metrics(h->job, flags, m);
  if (status == 0)
    return true;
  if (status == SL_ENOTSTARTED)
    *rc = respond_error(conn, MHD_HTTP_SERVICE_UNAVAILABLE, 0,
                        "the job has not started");
  else
    *rc = respond_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, 0,
                        "cannot read the metrics: %s", sl_strerror(status));
  return false;
}

static enum MHD_Result get_metrics(struct MHD_Connection *conn, sl_http *h) {
  sl_metrics m;
  enum MHD_Result rc = MHD_NO;
  if (!snapshot(conn, h, 0, &m, &rc))
    return rc;
  size_t bytes = 0;
  char *body = sl_exposition_prometheus(&m, h->job->name,
                                        sl_job_captures_aborted(h->job),
                                        &bytes);
  sl_metrics_free(&m);
  if (!body)
    return respond_error(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, 0,
                         "out of memory");
  return respond(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8",
                 body, bytes, 0);
}

static enum MHD_Result get_jobs(struct MHD_Connection *conn, sl_http *h) {
  sl_metrics m;
  enum MHD_Result rc = MHD_NO;
  if (!snapshot(conn, h, 0, &m, &rc))
    return rc;
  json_t *body = sl_exposition_jobs(&m);
  sl_metrics_free(&m);
  return respond_json(conn, MHD_HTTP_OK, body, 0);
}

/* A decimal in [min, max] from text; false for anything else. */
static bool parse_count(const char *text, long min, long max, long *out) {
  if (!text || *text < '0' || *text > '9')
    return false;
  char *end = 0;
  errno = 0;
  long v = strtol(text, &end, 10);
  if (errno || *end || v < min || v > max)
    return false;
  *out = v;
  return true;
}

static enum MHD_Result get_checkpoints(struct MHD_Connection *conn,
                                       sl_http *h) {
  long limit = SL_CHECKPOINT_HISTORY;
  const char *text =
      MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "limit");
  if (text && !parse_count(text, 0, SL_CHECKPOINT_HISTORY, &limit))
    return respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                         "limit must be a whole number from 0 to %d",
                         SL_CHECKPOINT_HISTORY);
  sl_metrics m;
  enum MHD_Result rc = MHD_NO;
  if (!snapshot(conn, h, SL_METRICS_HISTORY, &m, &rc))
    return rc;
  json_t *body = sl_exposition_checkpoints(&m, (int)limit);
  sl_metrics_free(&m);
  return respond_json(conn, MHD_HTTP_OK, body, 0);
}

/* ------------------------------------------------------- savepoints */

/* The savepoint name of the request (note 5) into name (name_bytes its
 * length, which a NUL inside it does not cut short): the query's dir,
 * else the JSON body's "dir" (or Flink's "target-directory").  *given is
 * false when the request names none.  false (an answer queued in *rc) for
 * a body that is no JSON object or a name that is no string. */
static bool savepoint_name(struct MHD_Connection *conn, const request *req,
                           const char **name, size_t *name_bytes,
                           json_t **json, bool *given, enum MHD_Result *rc) {
  *given = false;
  *json = 0;
  if (MHD_lookup_connection_value_n(conn, MHD_GET_ARGUMENT_KIND, "dir", 3,
                                    name, name_bytes) == MHD_YES) {
    *given = true;
    if (!*name)
      *name = "", *name_bytes = 0; /* "?dir" without a value */
    return true;
  }
  if (!req->body || req->body_bytes == 0)
    return true;
  json_error_t e;
  *json = json_loadb(req->body, req->body_bytes, JSON_REJECT_DUPLICATES, &e);
  if (!*json) {
    *rc = respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                        "the body is not JSON (line %d: %s)", e.line, e.text);
    return false;
  }
  if (!json_is_object(*json)) {
    *rc = respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                        "the body is JSON but not an object {\"dir\": NAME}");
    return false;
  }
  json_t *v = json_object_get(*json, "dir");
  if (!v)
    v = json_object_get(*json, "target-directory");
  if (!v)
    return true;
  if (!json_is_string(v)) {
    *rc = respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                        "\"dir\" must be a string: a name below the "
                        "savepoint root");
    return false;
  }
  *given = true;
  *name = json_string_value(v);
  *name_bytes = json_string_length(v); /* \u0000 is refused by jansson */
  return true;
}

/* The directories no savepoint may enter (note 5), canonical, into dirs
 * (each PATH_MAX bytes); their count. */
static size_t protected_paths(const sl_http *h, char (*dirs)[PATH_MAX]) {
  size_t n = 0;
  const char *state = h->job->state_dir;
  if (state && sl_http_canonical_path(state, dirs[n], PATH_MAX))
    n++;
  for (size_t i = 0; i < h->protected_count; i++)
    if (sl_http_canonical_path(h->protected_dirs[i], dirs[n], PATH_MAX))
      n++; /* one that cannot be resolved now was refused at start */
  assert(n <= HTTP_PROTECTED_MAX + 1);
  return n;
}

static unsigned savepoint_http_status(int status) {
  switch (status) {
  case EINVAL:
  case ENAMETOOLONG:
    return MHD_HTTP_BAD_REQUEST;
  case ENOSYS:
    return MHD_HTTP_NOT_IMPLEMENTED;
  case EBUSY:
  case EEXIST:
  case ENOTEMPTY:
  case SL_ENOTSTARTED:
  case SL_EUSAGE:
  case SL_ESTOPPED:
  case SL_ENOTFOUND: /* no checkpoint is complete yet */
    return MHD_HTTP_CONFLICT; /* the job's state does not allow it now */
  default:
    return MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
}

/* POST /stop (note 10): whether to drain, from the query's drain, else
 * the JSON body's "drain" (a boolean); absent: no drain.  false (an
 * answer queued in *rc) for another value. */
static bool stop_drain(struct MHD_Connection *conn, const request *req,
                       bool *drain, enum MHD_Result *rc) {
  *drain = false;
  const char *text = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND,
                                                 "drain");
  json_t *json = 0;
  if (!text && req->body && req->body_bytes) {
    json = json_loadb(req->body, req->body_bytes, 0, 0);
    json_t *v = json_is_object(json) ? json_object_get(json, "drain") : 0;
    if (v && !json_is_boolean(v)) {
      json_decref(json);
      *rc = respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                          "\"drain\" must be true or false");
      return false;
    }
    *drain = v && json_is_true(v);
  } else if (text) {
    if (strcmp(text, "true") != 0 && strcmp(text, "false") != 0) {
      *rc = respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                          "drain must be true or false, not '%s'", text);
      return false;
    }
    *drain = strcmp(text, "true") == 0;
  }
  json_decref(json);
  return true;
}

/* Write the savepoint into path (name: what the client called it); with
 * stop, stop the job with it (note 10). */
static enum MHD_Result write_savepoint(struct MHD_Connection *conn,
                                       sl_http *h, const char *name,
                                       const char *path, bool stop,
                                       bool drain) {
  char err[512] = "";
  uint64_t id = 0;
  pthread_mutex_lock(&h->savepoint_lock); /* note 2 */
  int status = stop ? sl_job_stop_with_savepoint(h->job, path,
                                                 drain ? SL_STOP_DRAIN : 0,
                                                 &id, err, sizeof err)
                    : sl_job_savepoint(h->job, path, &id, err, sizeof err);
  pthread_mutex_unlock(&h->savepoint_lock);
  if (status == 0 && stop)
    return respond_json(conn, MHD_HTTP_OK,
                        json_pack("{s:I,s:s,s:s,s:b}", "checkpoint_id",
                                  (json_int_t)id, "dir", name, "path", path,
                                  "drain", drain),
                        0);
  if (status == 0)
    return respond_json(conn, MHD_HTTP_OK,
                        json_pack("{s:I,s:s,s:s}", "checkpoint_id",
                                  (json_int_t)id, "dir", name, "path", path),
                        0);
  json_t *body = json_pack("{s:s,s:i,s:s,s:s,s:s}", "error",
                           err[0] ? err : sl_strerror(status), "status",
                           status, "status_text", sl_strerror(status), "dir",
                           name, "path", path);
  return respond_json(conn, savepoint_http_status(status), body, 0);
}

static enum MHD_Result post_savepoint(struct MHD_Connection *conn, sl_http *h,
                                      const request *req, bool stop) {
  if (!h->savepoint_root) /* note 5 */
    return respond_error(conn, MHD_HTTP_FORBIDDEN, 0,
                         "%s over HTTP are off: no savepoint root is "
                         "configured (sluice run --savepoint-dir DIR, or "
                         "sl_http_options.savepoint_root)",
                         stop ? "stops with a savepoint" : "savepoints");
  const char *name = 0;
  size_t name_bytes = 0;
  json_t *json = 0;
  bool given = false, drain = false;
  enum MHD_Result rc = MHD_NO;
  if (stop && !stop_drain(conn, req, &drain, &rc))
    return rc;
  if (!savepoint_name(conn, req, &name, &name_bytes, &json, &given, &rc)) {
    json_decref(json);
    return rc;
  }
  char generated[64];
  if (!given) { /* savepoint-<newest complete checkpoint>-<unix ms> */
    uint64_t restored = 0, last = sl_job_last_checkpoint(h->job, &restored);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    name_bytes = (size_t)snprintf(
        generated, sizeof generated, "savepoint-%" PRIu64 "-%" PRId64,
        last ? last : restored,
        (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000);
    name = generated;
  }
  json_t *utf8 = json_stringn(name, name_bytes); /* NULL: not UTF-8 */
  json_decref(utf8);
  if (!utf8 && name_bytes == strnlen(name, name_bytes)) {
    json_decref(json);
    return respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                         "the savepoint name is not UTF-8");
  }
  char dirs[HTTP_PROTECTED_MAX + 1][PATH_MAX];
  size_t dir_count = protected_paths(h, dirs);
  const char *protected[HTTP_PROTECTED_MAX + 1];
  for (size_t i = 0; i < dir_count; i++)
    protected[i] = dirs[i];
  char path[PATH_MAX], why[600];
  unsigned status = sl_http_savepoint_target(
      h->savepoint_root, protected, dir_count, name, name_bytes, path,
      sizeof path, why, sizeof why);
  /* The name for the answer: up to a NUL, which was refused anyway. */
  char shown[SL_HTTP_SAVEPOINT_NAME_MAX + 1];
  snprintf(shown, sizeof shown, "%.*s", (int)strnlen(name, name_bytes), name);
  json_decref(json); /* name may point into it: copied first */
  if (status)
    return respond_json(conn, status,
                        json_pack("{s:s,s:s,s:s}", "error", why, "dir", shown,
                                  "root", h->savepoint_root),
                        0);
  return write_savepoint(conn, h, shown, path, stop, drain);
}

/* ------------------------------------------------------- guards */

/* Note 7: a == b, in time that depends on b's length only (b is the
 * token; a comes from the request). */
static bool token_equal(const char *a, size_t a_bytes, const char *b,
                        size_t b_bytes) {
  unsigned char diff = a_bytes != b_bytes;
  for (size_t i = 0; i < b_bytes; i++)
    diff |= (unsigned char)((i < a_bytes ? (unsigned char)a[i] : 0) ^
                            (unsigned char)b[i]);
  return diff == 0;
}

/* Note 7: "Authorization: Bearer <token>". */
static bool authorized(struct MHD_Connection *conn, const sl_http *h) {
  if (!h->token)
    return true;
  const char *value = 0;
  size_t bytes = 0;
  if (MHD_lookup_connection_value_n(conn, MHD_HEADER_KIND,
                                    MHD_HTTP_HEADER_AUTHORIZATION,
                                    strlen(MHD_HTTP_HEADER_AUTHORIZATION),
                                    &value, &bytes) != MHD_YES ||
      !value || bytes < 7 || strncasecmp(value, "Bearer ", 7) != 0)
    return false;
  return token_equal(value + 7, bytes - 7, h->token, h->token_bytes);
}

/* The address this connection reached, as the host part of a URL
 * ("127.0.0.1", "[::1]"), and whether it is a loopback address. */
static bool local_host(struct MHD_Connection *conn, char *out,
                       size_t out_bytes, bool *loopback) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (!info || getsockname(info->connect_fd, (struct sockaddr *)&ss, &len))
    return false;
  char text[INET6_ADDRSTRLEN];
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *v4 = (const struct sockaddr_in *)&ss;
    *loopback = (ntohl(v4->sin_addr.s_addr) >> 24) == 127;
    inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text);
    snprintf(out, out_bytes, "%s", text);
    return true;
  }
  if (ss.ss_family != AF_INET6)
    return false;
  const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)&ss;
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) { /* IPv4 over a :: socket */
    *loopback = v6->sin6_addr.s6_addr[12] == 127;
    inet_ntop(AF_INET, &v6->sin6_addr.s6_addr[12], text, sizeof text);
    snprintf(out, out_bytes, "%s", text);
    return true;
  }
  *loopback = IN6_IS_ADDR_LOOPBACK(&v6->sin6_addr);
  inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
  snprintf(out, out_bytes, "[%s]", text);
  return true;
}

/* Whether "HOST[:PORT]" (text) names this endpoint: host is host (or
 * localhost when loopback), the port ours (absent: 80). */
static bool names_endpoint(const char *text, const char *host, bool loopback,
                           int port) {
  char want[128];
  const char *hosts[2] = {host, loopback ? "localhost" : 0};
  for (int i = 0; i < 2 && hosts[i]; i++) {
    snprintf(want, sizeof want, "%s:%d", hosts[i], port);
    if (strcasecmp(text, want) == 0)
      return true;
    if (port == 80 && strcasecmp(text, hosts[i]) == 0)
      return true;
  }
  return false;
}

/* Note 6: Origin, if present, is this endpoint; on loopback, Host too.
 * false with why set otherwise. */
static bool same_origin(struct MHD_Connection *conn, const sl_http *h,
                        char *why, size_t why_bytes) {
  char host[INET6_ADDRSTRLEN + 2];
  bool loopback = false;
  if (!local_host(conn, host, sizeof host, &loopback)) {
    snprintf(why, why_bytes, "cannot tell which address was reached");
    return false;
  }
  const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_ORIGIN);
  if (origin && (strncasecmp(origin, "http://", 7) != 0 ||
                 !names_endpoint(origin + 7, host, loopback, h->port))) {
    snprintf(why, why_bytes, "cross-origin request refused: Origin %.200s "
             "is not http://%s:%d", origin, host, h->port);
    return false;
  }
  const char *host_header = MHD_lookup_connection_value(
      conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
  if (loopback && host_header &&
      !names_endpoint(host_header, host, loopback, h->port)) {
    snprintf(why, why_bytes, "Host %.200s is not this endpoint (%s:%d or "
             "localhost:%d): refused against DNS rebinding", host_header,
             host, h->port, h->port);
    return false;
  }
  return true;
}

/* Note 6: the form types a browser sends cross-site without asking. */
static bool form_type(const char *type) {
  static const char *const forms[] = {
      "application/x-www-form-urlencoded", "multipart/form-data",
      "text/plain"};
  size_t n = strcspn(type, "; \t"); /* the media type without parameters */
  for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++)
    if (n == strlen(forms[i]) && strncasecmp(type, forms[i], n) == 0)
      return true;
  return false;
}

/* Note 9: whether Content-Length says more than HTTP_BODY_MAX (a value
 * that is no number is left to libmicrohttpd, which refuses it). */
static bool declared_too_large(struct MHD_Connection *conn) {
  const char *text = MHD_lookup_connection_value(
      conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (!text)
    return false;
  size_t digits = strspn(text, "0123456789");
  if (digits == 0)
    return false;
  if (digits > 18)
    return true; /* beyond any limit, and strtoull need not say so */
  return strtoull(text, 0, 10) > HTTP_BODY_MAX;
}

/* The checks of notes 6, 7 and 9, when the headers are in: true with an
 * answer queued in *rc when the request is refused. */
static bool refused(struct MHD_Connection *conn, const sl_http *h,
                    const char *method, enum MHD_Result *rc) {
  if (!authorized(conn, h)) {
    *rc = respond_error(conn, MHD_HTTP_UNAUTHORIZED,
                        "Bearer realm=\"sluice\"",
                        "this endpoint needs Authorization: Bearer <token>");
    return true;
  }
  char why[512];
  if (!same_origin(conn, h, why, sizeof why)) {
    *rc = respond_error(conn, MHD_HTTP_FORBIDDEN, 0, "%s", why);
    return true;
  }
  const char *type = MHD_lookup_connection_value(
      conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
  if (type && strcmp(method, MHD_HTTP_METHOD_POST) == 0 && form_type(type)) {
    *rc = respond_error(conn, MHD_HTTP_FORBIDDEN, 0,
                        "Content-Type %.100s is refused (a browser sends it "
                        "cross-site): send no body, or application/json",
                        type);
    return true;
  }
  if (declared_too_large(conn)) {
    *rc = respond_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, 0,
                        "the request body is over %u bytes", HTTP_BODY_MAX);
    return true;
  }
  return false;
}

/* ------------------------------------------------------- deadlines */

/* The client record of conn (note 8), or NULL. */
static client *client_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return info ? info->socket_context : 0;
}

/* Set conn's deadline: 0 (off) or now + the header timeout. */
static void client_arm(sl_http *h, struct MHD_Connection *conn, bool on) {
  client *c = client_of(conn);
  if (!c)
    return;
  pthread_mutex_lock(&h->clients_lock);
  c->deadline_ns = on ? now_ns() + h->header_timeout_ns : 0;
  pthread_mutex_unlock(&h->clients_lock);
}

/* libmicrohttpd's notice of a connection opened or closed: keep its
 * client record (note 8). */
static void connection_event(void *cls, struct MHD_Connection *conn,
                             void **socket_context,
                             enum MHD_ConnectionNotificationCode code) {
  sl_http *h = cls;
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    client *c = *socket_context;
    if (!c)
      return;
    pthread_mutex_lock(&h->clients_lock);
    *(c->prev ? &c->prev->next : &h->clients) = c->next;
    if (c->next)
      c->next->prev = c->prev;
    assert(h->client_count > 0);
    h->client_count--;
    pthread_mutex_unlock(&h->clients_lock);
    close(c->fd);
    free(c);
    *socket_context = 0;
    return;
  }
  const union MHD_ConnectionInfo *info =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  client *c = calloc(1, sizeof *c);
  /* A dup, so the number the reaper shuts down is never reused by another
   * file while the record lives. */
  int fd = info ? fcntl(info->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (!c || fd < 0) {
    if (info) /* without a deadline it may not stay: drop it now */
      shutdown(info->connect_fd, SHUT_RDWR);
    if (fd >= 0)
      close(fd);
    free(c);
    *socket_context = 0;
    return;
  }
  c->fd = fd;
  pthread_mutex_lock(&h->clients_lock);
  c->deadline_ns = now_ns() + h->header_timeout_ns;
  c->next = h->clients;
  if (c->next)
    c->next->prev = c;
  h->clients = c;
  h->client_count++;
  pthread_mutex_unlock(&h->clients_lock);
  *socket_context = c;
}

/* Shut down the sockets past their deadline; the next deadline (0: none).
 * Called with clients_lock held. */
static uint64_t reap(sl_http *h, uint64_t now) {
  uint64_t next = 0;
  unsigned seen __attribute__((unused)) = 0; /* for the assert only */
  for (client *c = h->clients; c; c = c->next) {
    assert(++seen <= h->client_count); /* the list is no cycle */
    if (!c->deadline_ns)
      continue;
    if (c->deadline_ns <= now) {
      /* libmicrohttpd's thread then reads the end and closes it. */
      shutdown(c->fd, SHUT_RDWR);
      c->deadline_ns = 0;
    } else if (!next || c->deadline_ns < next) {
      next = c->deadline_ns;
    }
  }
  return next;
}

/* The reaper thread (note 8): wakes at the next deadline, at most every
 * HTTP_REAPER_TICK_MS (a deadline set meanwhile waits that long at most),
 * until sl_http_stop. */
static void *reaper_main(void *arg) {
  sl_http *h = arg;
  pthread_mutex_lock(&h->clients_lock);
  while (!h->reaper_stop) {
    uint64_t now = now_ns();
    uint64_t next = reap(h, now);
    uint64_t tick = now + HTTP_REAPER_TICK_MS * 1000000ull;
    uint64_t wake = next && next < tick ? next : tick;
    struct timespec t = {.tv_sec = (time_t)(wake / 1000000000u),
                         .tv_nsec = (long)(wake % 1000000000u)};
    pthread_cond_timedwait(&h->clients_cond, &h->clients_lock, &t);
  }
  pthread_mutex_unlock(&h->clients_lock);
  return 0;
}

/* ------------------------------------------------------- dispatch */

enum route_method { ROUTE_GET, ROUTE_POST };

static const struct route {
  const char *path;
  enum route_method method;
} routes[] = {
    {"/metrics", ROUTE_GET},
    {"/jobs", ROUTE_GET},
    {"/checkpoints", ROUTE_GET},
    {"/savepoints", ROUTE_POST},
    {"/stop", ROUTE_POST},
};

static enum MHD_Result dispatch(struct MHD_Connection *conn, sl_http *h,
                                const char *url, const char *method,
                                const request *req) {
  assert(url && method);
  size_t n = sizeof routes / sizeof routes[0];
  for (size_t i = 0; i < n; i++) {
    const struct route *r = &routes[i];
    if (strcmp(url, r->path) != 0)
      continue;
    bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
               strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    if (r->method == ROUTE_GET && !get)
      return respond_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "GET, HEAD",
                           "%s allows GET and HEAD, not %s", r->path, method);
    if (r->method == ROUTE_POST && !post)
      return respond_error(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "POST",
                           "%s allows POST, not %s", r->path, method);
    if (i == 0)
      return get_metrics(conn, h);
    if (i == 1)
      return get_jobs(conn, h);
    if (i == 2)
      return get_checkpoints(conn, h);
    return post_savepoint(conn, h, req, i == 4);
  }
  return respond_error(conn, MHD_HTTP_NOT_FOUND, 0,
                       "no such path: %s (try /metrics, /jobs, /checkpoints, "
                       "POST /savepoints or POST /stop)",
                       url);
}

/* Keep a body chunk; false once the body is over HTTP_BODY_MAX bytes in
 * all (note 9) or cannot be kept. */
static bool take_body(request *req, const char *data, size_t bytes) {
  assert(bytes > 0);
  assert(req->body_bytes <= HTTP_BODY_MAX);
  if (bytes > HTTP_BODY_MAX - req->body_bytes)
    return false;
  char *body = realloc(req->body, req->body_bytes + bytes + 1);
  if (!body)
    return false;
  memcpy(body + req->body_bytes, data, bytes);
  req->body_bytes += bytes;
  body[req->body_bytes] = 0;
  req->body = body;
  return true;
}

static enum MHD_Result handle_request(void *cls, struct MHD_Connection *conn,
                                      const char *url, const char *method,
                                      const char *version,
                                      const char *upload_data,
                                      size_t *upload_data_size,
                                      void **con_cls) {
  (void)version;
  sl_http *h = cls;
  request *req = *con_cls;
  if (!req) { /* headers in: check them (refused), read on */
    req = calloc(1, sizeof *req);
    if (!req)
      return MHD_NO;
    *con_cls = req;
    enum MHD_Result rc = MHD_YES;
    req->answered = refused(conn, h, method, &rc);
    return rc;
  }
  if (*upload_data_size > 0) {
    bool kept = req->answered || take_body(req, upload_data,
                                           *upload_data_size);
    *upload_data_size = 0;
    return kept ? MHD_YES : MHD_NO; /* MHD_NO closes the connection */
  }
  if (req->answered)
    return MHD_YES;
  client_arm(h, conn, false); /* note 8: answering may take long */
  return dispatch(conn, h, url, method, req);
}

static void request_done(void *cls, struct MHD_Connection *conn,
                         void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)toe;
  request *req = *con_cls;
  if (req) {
    free(req->body);
    free(req);
    *con_cls = 0;
  }
  client_arm(cls, conn, true); /* note 8: the next request's turn */
}

/* ------------------------------------------------------- the server */

typedef union address {
  struct sockaddr any;
  struct sockaddr_in v4;
  struct sockaddr_in6 v6;
} address;

/* address text and port into a socket address; false if not numeric. */
static bool parse_address(const char *text, int port, address *a,
                          socklen_t *bytes) {
  memset(a, 0, sizeof *a);
  if (inet_pton(AF_INET, text, &a->v4.sin_addr) == 1) {
    a->v4.sin_family = AF_INET;
    a->v4.sin_port = htons((uint16_t)port);
    *bytes = sizeof a->v4;
    return true;
  }
  if (inet_pton(AF_INET6, text, &a->v6.sin6_addr) == 1) {
    a->v6.sin6_family = AF_INET6;
    a->v6.sin6_port = htons((uint16_t)port);
    *bytes = sizeof a->v6;
    return true;
  }
  return false;
}

/* Note 7: 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104; not the wildcards. */
static bool loopback_address(const address *a) {
  if (a->any.sa_family == AF_INET)
    return (ntohl(a->v4.sin_addr.s_addr) >> 24) == 127;
  const struct in6_addr *v6 = &a->v6.sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(v6) ||
         (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127);
}

/* Why the server could not listen on a: libmicrohttpd does not say, so
 * bind a socket there ourselves and report what bind() or listen() says
 * (EIO if they succeed now). */
static int listen_error(const address *a, socklen_t bytes) {
  int fd = socket(a->any.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, &a->any, bytes) != 0 || listen(fd, 1) != 0 ? errno : EIO;
  close(fd);
  return rc;
}

/* The caller's options into o, all defaults filled in: the fields it
 * knows (struct_bytes) and zero past them.  EINVAL for a size this
 * library cannot read or a value out of range. */
static int read_options(const sl_http_options *in, sl_http_options *o) {
  /* The first version ends with connections_per_client_max. */
  size_t first = offsetof(sl_http_options, connections_per_client_max) +
                 sizeof in->connections_per_client_max;
  if (!in || in->struct_bytes < first)
    return EINVAL;
  const unsigned char *tail = (const unsigned char *)in + sizeof *o;
  for (size_t i = sizeof *o; i < in->struct_bytes; i++) /* a later header */
    if (tail[i - sizeof *o])
      return EINVAL; /* a field this library does not know, set */
  memset(o, 0, sizeof *o);
  memcpy(o, in, in->struct_bytes < sizeof *o ? in->struct_bytes : sizeof *o);
  if (!o->header_timeout_ms)
    o->header_timeout_ms = HTTP_HEADER_TIMEOUT_MS;
  if (!o->connections_max)
    o->connections_max = HTTP_CONNECTIONS_MAX;
  if (!o->connections_per_client_max)
    o->connections_per_client_max =
        o->connections_max < HTTP_CLIENT_CONNECTIONS_MAX
            ? o->connections_max : HTTP_CLIENT_CONNECTIONS_MAX;
  if (o->port < 0 || o->port > 65535 ||
      o->header_timeout_ms > HTTP_TIMEOUT_LIMIT_MS ||
      o->connections_max > HTTP_CONNECTIONS_LIMIT ||
      o->connections_per_client_max > o->connections_max)
    return EINVAL;
  return 0;
}

/* Note 7: 16 .. 1024 visible ASCII characters. */
static bool token_valid(const char *token) {
  size_t n = strnlen(token, HTTP_TOKEN_MAX + 1);
  if (n < HTTP_TOKEN_MIN || n > HTTP_TOKEN_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    if (token[i] < 0x21 || token[i] > 0x7e)
      return false;
  return true;
}

/* Note 5: the root, created if missing, canonical, and outside the job's
 * own directories; the protected directories kept.  0 or an errno. */
static int set_savepoint_dirs(sl_http *h, const sl_http_options *o) {
  for (size_t i = 0; o->protected_dirs && o->protected_dirs[i]; i++) {
    if (i == HTTP_PROTECTED_MAX || !o->protected_dirs[i][0])
      return EINVAL;
    h->protected_dirs[i] = strdup(o->protected_dirs[i]);
    if (!h->protected_dirs[i])
      return ENOMEM;
    h->protected_count = i + 1;
  }
  if (!o->savepoint_root)
    return 0;
  if (!o->savepoint_root[0])
    return EINVAL;
  char path[PATH_MAX], made[PATH_MAX];
  char dirs[HTTP_PROTECTED_MAX + 1][PATH_MAX];
  size_t n = protected_paths(h, dirs);
  /* Before creating it, and again once it exists (links resolved). */
  if (!sl_http_canonical_path(o->savepoint_root, made, sizeof made))
    return errno;
  for (size_t i = 0; i < n; i++)
    if (sl_http_path_inside(made, dirs[i]))
      return EINVAL; /* every savepoint would land in the job's own dir */
  if (snprintf(path, sizeof path, "%s", o->savepoint_root) >= (int)sizeof path)
    return ENAMETOOLONG;
  for (char *p = path + 1; *p; p++) /* mkdir -p */
    if (*p == '/') {
      *p = 0;
      if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return errno;
      *p = '/';
    }
  if (mkdir(path, 0777) != 0 && errno != EEXIST)
    return errno;
  if (!realpath(path, made))
    return errno;
  struct stat st;
  if (stat(made, &st) != 0 || !S_ISDIR(st.st_mode))
    return ENOTDIR;
  for (size_t i = 0; i < n; i++)
    if (sl_http_path_inside(made, dirs[i]))
      return EINVAL;
  h->savepoint_root = strdup(made);
  return h->savepoint_root ? 0 : ENOMEM;
}

static void http_free(sl_http *h) {
  for (size_t i = 0; i < h->protected_count; i++)
    free(h->protected_dirs[i]);
  free(h->savepoint_root);
  if (h->token) /* a secret: not left in freed memory */
    explicit_bzero(h->token, h->token_bytes);
  free(h->token);
  pthread_cond_destroy(&h->clients_cond);
  pthread_mutex_destroy(&h->clients_lock);
  pthread_mutex_destroy(&h->savepoint_lock);
  free(h);
}

/* A new server record for job with options o (not listening yet). */
static int http_new(sl_job *job, const sl_http_options *o, sl_http **out) {
  sl_http *h = calloc(1, sizeof *h);
  if (!h)
    return ENOMEM;
  h->job = job;
  h->header_timeout_ns = (uint64_t)o->header_timeout_ms * 1000000u;
  pthread_mutex_init(&h->savepoint_lock, 0);
  pthread_mutex_init(&h->clients_lock, 0);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* as now_ns */
  pthread_cond_init(&h->clients_cond, &ca);
  pthread_condattr_destroy(&ca);
  int rc = 0;
  if (o->bearer_token) {
    h->token = strdup(o->bearer_token);
    h->token_bytes = h->token ? strlen(h->token) : 0;
    rc = h->token ? 0 : ENOMEM;
  }
  if (!rc)
    rc = set_savepoint_dirs(h, o);
  if (rc) {
    http_free(h);
    return rc;
  }
  *out = h;
  return 0;
}

SL_EXPORT int sl_http_start_with(sl_job *job, const sl_http_options *options,
                                 sl_http **http) {
  if (http)
    *http = 0;
  sl_http_options o;
  address a;
  socklen_t bytes = 0;
  if (!job || !http || read_options(options, &o) != 0 ||
      !parse_address(o.address ? o.address : "127.0.0.1", o.port, &a,
                     &bytes) ||
      (o.bearer_token && !token_valid(o.bearer_token)))
    return EINVAL;
  if (!o.bearer_token && !loopback_address(&a))
    return SL_EUSAGE; /* note 7 */
  sl_http *h = 0;
  int rc = http_new(job, &o, &h);
  if (rc)
    return rc;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
  if (a.any.sa_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  h->daemon = MHD_start_daemon(
      flags, (uint16_t)o.port, 0, 0, handle_request, h,
      MHD_OPTION_SOCK_ADDR, &a.any,
      MHD_OPTION_CONNECTION_LIMIT, o.connections_max,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, o.connections_per_client_max,
      MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_TIMEOUT_S,
      MHD_OPTION_NOTIFY_CONNECTION, connection_event, h,
      MHD_OPTION_NOTIFY_COMPLETED, request_done, h,
      MHD_OPTION_END);
  if (!h->daemon) {
    http_free(h);
    return listen_error(&a, bytes);
  }
  if (pthread_create(&h->reaper, 0, reaper_main, h) != 0) {
    /* without it note 8 does not hold */
    MHD_stop_daemon(h->daemon);
    http_free(h);
    return ENOMEM;
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? info->port : o.port;
  assert(h->port > 0 && h->port <= 65535);
  *http = h;
  return 0;
}

SL_EXPORT int sl_http_start(sl_job *job, const char *address_text, int port,
                            sl_http **http) {
  sl_http_options o = SL_HTTP_OPTIONS_INIT;
  o.address = address_text;
  o.port = port;
  return sl_http_start_with(job, &o, http);
}

SL_EXPORT int sl_http_port(const sl_http *http) {
  return http ? http->port : 0;
}

SL_EXPORT void sl_http_stop(sl_http *http) {
  if (!http)
    return;
  assert(http->daemon);
  MHD_stop_daemon(http->daemon); /* joins its threads; every client closed */
  pthread_mutex_lock(&http->clients_lock);
  assert(http->client_count == 0 && !http->clients);
  http->reaper_stop = true;
  pthread_cond_signal(&http->clients_cond);
  pthread_mutex_unlock(&http->clients_lock);
  pthread_join(http->reaper, 0);
  http_free(http);
}
