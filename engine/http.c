/* http.c — the embedded HTTP endpoint of a job (sluice.h, "HTTP
 * endpoint"): Prometheus text on /metrics, JSON on /jobs and /checkpoints,
 * savepoints on POST /savepoints; libmicrohttpd serves it.
 *
 * NOTES ON THE DESIGN
 *
 * 1. The engine is read only through sl_job_metrics() (metrics.c): relaxed
 *    loads and one lock the coordinator holds for a copy at a time.  No
 *    handler takes a lock an instance thread takes, so a slow or stuck
 *    client never slows the job.
 * 2. libmicrohttpd runs a listening thread and one thread per connection,
 *    at most HTTP_CONNECTIONS_MAX of them, each dropped after
 *    HTTP_IDLE_TIMEOUT_S of silence: a savepoint request, which lasts as
 *    long as the savepoint, does not hold up a scrape of /metrics.
 *    Savepoint requests are served one at a time (savepoint_lock).
 * 3. A request is answered once its body has been read (at most
 *    HTTP_BODY_MAX bytes; more gets 413).  Routing: a known path with
 *    another method gets 405 and an Allow header, an unknown path 404, a
 *    bad parameter 400; every error body is JSON {"error": "..."}.
 * 4. The documents come from exposition.c; error bodies and the
 *    savepoint answer are built with jansson too, so user text (paths,
 *    failure messages) is always escaped.
 *
 * Request states (handle_request, per connection):
 *
 *   new --[first call: allocate]--> reading --[body chunks]--> reading
 *                                     |
 *                                     +--[final call]--> answered --> freed
 *                                                        [request_done]
 */
#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exposition.h"
#include "internal.h"

#define HTTP_CONNECTIONS_MAX 16u /* note 2: threads the endpoint may use */
#define HTTP_IDLE_TIMEOUT_S 30u
#define HTTP_BODY_MAX (64u << 10) /* note 3: a directory name fits easily */
#define HTTP_PATH_MAX 4096u       /* a savepoint directory */

struct sl_http {
  sl_job *job;
  struct MHD_Daemon *daemon;
  int port;
  pthread_mutex_t savepoint_lock; /* note 2 */
};

/* One request being read (note 3). */
typedef struct request {
  char *body;
  size_t body_bytes;
  bool too_large;
} request;

/* ------------------------------------------------------- responses */

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
  if (allow)
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
  char *body = sl_exposition_prometheus(&m, &bytes);
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

/* dir from a form body ("a=b&dir=...", percent-encoded, '+' for space)
 * into out; false if there is none. */
static bool form_dir(const char *body, char *out, size_t out_bytes) {
  const char *p = body;
  while (p && *p) {
    const char *end = strchr(p, '&');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n > 4 && strncmp(p, "dir=", 4) == 0 && n - 4 < out_bytes) {
      memcpy(out, p + 4, n - 4);
      out[n - 4] = 0;
      for (char *c = out; *c; c++)
        if (*c == '+')
          *c = ' ';
      size_t len = MHD_http_unescape(out);
      return len == strlen(out); /* "%00" would cut the name short */
    }
    p = end ? end + 1 : 0;
  }
  return false;
}

/* dir from a JSON body {"dir": ...} (or Flink's "target-directory"). */
static bool json_dir(const char *body, char *out, size_t out_bytes) {
  json_t *root = json_loads(body, JSON_REJECT_DUPLICATES, 0);
  json_t *v = json_object_get(root, "dir");
  if (!v)
    v = json_object_get(root, "target-directory");
  const char *s = json_string_value(v);
  size_t n = s ? json_string_length(v) : 0;
  bool ok = s && n > 0 && n < out_bytes && strlen(s) == n;
  if (ok)
    memcpy(out, s, n + 1);
  json_decref(root);
  return ok;
}

/* The savepoint directory of the request: the query's dir, else the
 * body's.  false (and nothing in out) if there is none or it is empty. */
static bool savepoint_dir(struct MHD_Connection *conn, const request *req,
                          char *out, size_t out_bytes) {
  const char *q = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND,
                                              "dir");
  if (q) {
    size_t n = strlen(q);
    if (n == 0 || n >= out_bytes)
      return false;
    memcpy(out, q, n + 1);
    return true;
  }
  if (!req->body || req->body_bytes == 0)
    return false;
  const char *type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_TYPE);
  if (type && strncmp(type, "application/json", 16) == 0)
    return json_dir(req->body, out, out_bytes);
  return form_dir(req->body, out, out_bytes) && out[0];
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
  case SL_ENOTSTARTED:
  case SL_EUSAGE:
  case SL_ESTOPPED:
  case SL_ENOTFOUND: /* no checkpoint is complete yet */
    return MHD_HTTP_CONFLICT; /* the job's state does not allow it now */
  default:
    return MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
}

static enum MHD_Result post_savepoint(struct MHD_Connection *conn, sl_http *h,
                                      const request *req) {
  char dir[HTTP_PATH_MAX];
  if (!savepoint_dir(conn, req, dir, sizeof dir))
    return respond_error(conn, MHD_HTTP_BAD_REQUEST, 0,
                         "a savepoint needs a directory: dir=PATH in the "
                         "query or the form body, or {\"dir\": PATH} as "
                         "JSON (at most %u bytes)", HTTP_PATH_MAX - 1);
  char err[512] = "";
  uint64_t id = 0;
  pthread_mutex_lock(&h->savepoint_lock); /* note 2 */
  int status = sl_job_savepoint(h->job, dir, &id, err, sizeof err);
  pthread_mutex_unlock(&h->savepoint_lock);
  if (status == 0)
    return respond_json(conn, MHD_HTTP_OK,
                        json_pack("{s:I,s:s}", "checkpoint_id",
                                  (json_int_t)id, "dir", dir),
                        0);
  json_t *body = json_pack("{s:s,s:i,s:s,s:s}", "error",
                           err[0] ? err : sl_strerror(status), "status",
                           status, "status_text", sl_strerror(status), "dir",
                           dir);
  return respond_json(conn, savepoint_http_status(status), body, 0);
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
    return post_savepoint(conn, h, req);
  }
  return respond_error(conn, MHD_HTTP_NOT_FOUND, 0,
                       "no such path: %s (try /metrics, /jobs, /checkpoints "
                       "or POST /savepoints)",
                       url);
}

/* Keep a body chunk, up to HTTP_BODY_MAX bytes in all (note 3). */
static void take_body(request *req, const char *data, size_t bytes) {
  assert(bytes > 0);
  assert(req->body_bytes <= HTTP_BODY_MAX);
  if (req->too_large || bytes > HTTP_BODY_MAX - req->body_bytes) {
    req->too_large = true;
    return;
  }
  char *body = realloc(req->body, req->body_bytes + bytes + 1);
  if (!body) {
    req->too_large = true; /* answered as too large: we cannot keep it */
    return;
  }
  memcpy(body + req->body_bytes, data, bytes);
  req->body_bytes += bytes;
  body[req->body_bytes] = 0;
  req->body = body;
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
  if (!req) { /* headers only so far: remember the request, read on */
    req = calloc(1, sizeof *req);
    if (!req)
      return MHD_NO;
    *con_cls = req;
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    take_body(req, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (req->too_large)
    return respond_error(conn, MHD_HTTP_CONTENT_TOO_LARGE, 0,
                         "the request body is over %u bytes", HTTP_BODY_MAX);
  return dispatch(conn, h, url, method, req);
}

static void request_done(void *cls, struct MHD_Connection *conn,
                         void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)conn, (void)toe;
  request *req = *con_cls;
  if (req) {
    free(req->body);
    free(req);
    *con_cls = 0;
  }
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

SL_EXPORT int sl_http_start(sl_job *job, const char *address_text, int port,
                            sl_http **http) {
  if (http)
    *http = 0;
  address a;
  socklen_t bytes = 0;
  if (!job || !http || port < 0 || port > 65535 ||
      !parse_address(address_text ? address_text : "127.0.0.1", port, &a,
                     &bytes))
    return EINVAL;
  sl_http *h = calloc(1, sizeof *h);
  if (!h)
    return ENOMEM;
  h->job = job;
  pthread_mutex_init(&h->savepoint_lock, 0);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
                   MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL;
  if (a.any.sa_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  h->daemon = MHD_start_daemon(
      flags, (uint16_t)port, 0, 0, handle_request, h,
      MHD_OPTION_SOCK_ADDR, &a.any,
      MHD_OPTION_CONNECTION_LIMIT, HTTP_CONNECTIONS_MAX,
      MHD_OPTION_CONNECTION_TIMEOUT, HTTP_IDLE_TIMEOUT_S,
      MHD_OPTION_NOTIFY_COMPLETED, request_done, h,
      MHD_OPTION_END);
  if (!h->daemon) {
    pthread_mutex_destroy(&h->savepoint_lock);
    free(h);
    return listen_error(&a, bytes);
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? info->port : port;
  assert(h->port > 0 && h->port <= 65535);
  *http = h;
  return 0;
}

SL_EXPORT int sl_http_port(const sl_http *http) {
  return http ? http->port : 0;
}

SL_EXPORT void sl_http_stop(sl_http *http) {
  if (!http)
    return;
  assert(http->daemon);
  MHD_stop_daemon(http->daemon); /* joins its threads */
  pthread_mutex_destroy(&http->savepoint_lock);
  free(http);
}
