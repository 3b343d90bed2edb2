/* http_disabled.c — the HTTP endpoint's calls in a library built without
 * it (meson -Dhttp=disabled, or libmicrohttpd not found): each start says
 * that the build has no endpoint and returns ENOTSUP, so a host learns it
 * from the call, not from a missing symbol.  The same symbols as http.c,
 * which this file replaces; sl_metrics_prometheus (exposition.c) stays,
 * so a host serves the metrics from its own endpoint.
 */
#include <errno.h>
#include <stddef.h>

#include "internal.h"
#include "log.h"

#define NO_HTTP_MESSAGE                                                        \
  "sl_http_start: this libsluice was built without the HTTP endpoint "        \
  "(meson -Dhttp=disabled, or libmicrohttpd missing); serve "                 \
  "sl_metrics_prometheus() from the host's own endpoint instead"

SL_EXPORT int sl_http_start_with(sl_job *job, const sl_http_options *options,
                                 sl_http **http) {
  (void)options;
  if (http)
    *http = NULL;
  if (!job || !http)
    return EINVAL;
  sl_log(SL_LOG_ERROR, "%s", NO_HTTP_MESSAGE);
  /* Only a job not yet started: a running job's message belongs to its
   * instance threads (a failure writes it), a finished one's to its
   * result. */
  if (atomic_load(&job->state) == SL_JOB_BUILDING)
    sl_job_set_error(job, "%s", NO_HTTP_MESSAGE);
  return ENOTSUP;
}

SL_EXPORT int sl_http_start(sl_job *job, const char *address, int port,
                            sl_http **http) {
  (void)address;
  (void)port;
  return sl_http_start_with(job, NULL, http);
}

/* No server can exist: these only accept what a caller may pass. */
SL_EXPORT int sl_http_port(const sl_http *http) {
  (void)http;
  return 0;
}

SL_EXPORT void sl_http_stop(sl_http *http) { (void)http; }
