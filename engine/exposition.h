/* exposition.h — the documents of the HTTP endpoint, rendered from a
 * metrics snapshot (exposition.c), for http.c. */
#ifndef SL_EXPOSITION_H
#define SL_EXPOSITION_H

#include <jansson.h>
#include <stddef.h>

#include "sluice.h"

/* GET /jobs: the job, its operators with their instances, totals.  A new
 * reference, or NULL when out of memory. */
json_t *sl_exposition_jobs(const sl_metrics *m);

/* GET /checkpoints: counts, latest, and the newest `limit` (0 .. 64)
 * history entries of m (taken with SL_METRICS_HISTORY).  A new reference,
 * or NULL when out of memory. */
json_t *sl_exposition_checkpoints(const sl_metrics *m, int limit);

/* GET /metrics and sl_metrics_prometheus: Prometheus text exposition
 * format 0.0.4, every sample labelled job="job_name" (1 .. SL_MAX_NAME-1
 * bytes), malloc'd, its length in *bytes; NULL when out of memory.
 * captures_aborted is sl_job_captures_aborted(), read beside m: it is no
 * field of sl_metrics, whose size callers fix when they allocate it. */
char *sl_exposition_prometheus(const sl_metrics *m, const char *job_name,
                               uint64_t captures_aborted, size_t *bytes);

#endif /* SL_EXPOSITION_H */
