/* sluice_metrics.h — what a running job reports: metrics snapshots
 * (engine/metrics.c) and the HTTP endpoint that serves them, with
 * savepoints on request (engine/http.c).  Included by sluice.h.
 */
#ifndef SLUICE_METRICS_H
#define SLUICE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Metrics (engine/metrics.c).
 *
 * sl_job_metrics() copies what an operator of the job wants to watch into
 * a caller-owned sl_metrics: per instance, per operator (sums) and per job.
 * Instance threads keep their counters in plain fields of their own and
 * publish copies with relaxed stores once per batch; they account time
 * once per wait, never per record.  A snapshot takes no lock an instance
 * thread ever takes, so polling it does not disturb the job.
 *
 * Time, as Flink reports it (busyTimeMsPerSecond and the others): each
 * instance's thread life splits into idle (waiting for input: spinning or
 * parked on empty input, on channels blocked by barrier alignment, or for
 * the final checkpoint), backpressured (waiting for room on a full output
 * ring) and busy (the rest, including open, restore, and all the time a
 * source spends inside next(), also if it sleeps there).  The figures are
 * cumulative nanoseconds over every attempt (restarts included); a poller
 * takes two snapshots and divides the differences by the time between them
 * (x 1000 for milliseconds per second).
 *
 * Records and bytes are cumulative over restarts too (records replayed
 * after a restore count again).  Bytes are record payload bytes, without
 * timestamps or ring headers; bytes out are those written into the output
 * rings, so a record sent to two consumer operators counts twice there
 * (once in records_out).  bytes_out is summed from the rings when the
 * instance flushes its outputs (at least every buffer timeout), so it may
 * trail records_out by one batch while the job runs. */

/** What the job is doing (sl_metrics.state). */
enum sl_job_status {
  SL_JOB_STATUS_CREATED = 0,    /* not started */
  SL_JOB_STATUS_RUNNING = 1,
  SL_JOB_STATUS_FAILING = 2,    /* failed; stopping, maybe to restart */
  SL_JOB_STATUS_CANCELLING = 3, /* sl_job_stop() was called */
  SL_JOB_STATUS_FINISHED = 4,   /* sl_job_wait() returned 0 */
  SL_JOB_STATUS_FAILED = 5,     /* sl_job_wait() returned a failure */
  SL_JOB_STATUS_CANCELED = 6,   /* sl_job_wait() returned SL_ESTOPPED */
};

/** Flink's name of a status ("RUNNING", "FAILED", ...); "UNKNOWN" for a
 * value outside the enum. */
const char *sl_job_status_name(int status);

/** One instance (a thread). */
typedef struct sl_instance_metrics {
  const char *name;   /* its operator's (valid until sl_job_destroy) */
  int operator_index; /* physical operator, creation order */
  int instance;       /* 0 .. parallelism-1 */
  int running;        /* its thread is alive */
  uint64_t records_in;
  uint64_t records_out;
  uint64_t bytes_in;  /* payload bytes */
  uint64_t bytes_out; /* payload bytes into the output rings (above) */
  uint64_t busy_ns;   /* see "Time" above */
  uint64_t idle_ns;
  uint64_t backpressured_ns;
  /** Ring occupancy: published, unread bytes over capacity (0 .. 1) of
   * each input ring (mean and fullest) and of the fullest output ring.  A
   * full input means this instance is the bottleneck; a full output, that
   * something downstream is.  0 with no rings, and for the moment a
   * restart empties them. */
  int input_rings;
  double input_fill_ratio;
  double input_fill_max_ratio;
  int output_rings;
  double output_fill_max_ratio;
  int64_t watermark;        /* current input watermark (a source: the last
                               it emitted); SL_WATERMARK_MIN: none */
  int has_watermark_lag;    /* watermark is a real time (neither MIN nor
                               MAX, nor <= 0) */
  int64_t watermark_lag_ms; /* wall clock now - watermark (event time taken
                               as milliseconds since the epoch) */
  uint64_t state_entries;   /* live keys of its keyed state */
  uint64_t state_bytes;     /* memory its keyed state holds, versions kept
                               for checkpoints included */
  uint64_t late_records;    /* SL_COUNT_LATE */
  uint64_t dead_letters;    /* SL_COUNT_DEAD_LETTER */
} sl_instance_metrics;

/** One physical operator: sums over its instances. */
typedef struct sl_operator_metrics {
  const char *name;
  int parallelism;
  int first_instance; /* its instances are sl_metrics.instances
                         [first_instance .. first_instance+parallelism-1] */
  uint64_t records_in;
  uint64_t records_out;
  uint64_t bytes_in;
  uint64_t bytes_out;
  uint64_t state_entries;
  uint64_t state_bytes;
  uint64_t late_records;
  uint64_t dead_letters;
  int64_t watermark; /* lowest among its instances */
} sl_operator_metrics;

/** A snapshot of a job.  Filled by sl_job_metrics(), freed by
 * sl_metrics_free(). */
typedef struct sl_metrics {
  int state;               /* enum sl_job_status */
  int64_t time_ms;         /* wall clock of the snapshot, Unix epoch */
  int64_t start_time_ms;   /* sl_job_start(), wall clock */
  uint64_t uptime_ns;      /* start to now, or to the end once waited */
  uint64_t source_records; /* sl_job_progress() */
  uint32_t restarts;       /* sl_job_restarts() */
  uint64_t faults_fired;   /* sl_job_faults_fired() */
  /** The newest failure: the one that ended the job (after sl_job_wait()
   * returned a failure), else the newest one recovered from by a restart;
   * status 0 and "" if none. */
  int last_failure_status;
  char last_failure[512];

  int operator_count;
  sl_operator_metrics *operators;
  int instance_count;
  sl_instance_metrics *instances; /* operator by operator, creation order */

  /** Checkpoints (all 0 when checkpointing is off).  total counts every
   * checkpoint triggered since sl_job_start(); failed counts the aborted
   * ones; latest_* are the newest to end each way (has_* says whether
   * there is one); restored_from is the checkpoint the newest attempt
   * started from (0: none). */
  int checkpointing;
  uint64_t checkpoints_total;
  uint64_t checkpoints_completed;
  uint64_t checkpoints_failed;
  uint64_t checkpoints_in_progress;
  uint64_t restored_from;
  int has_latest_completed;
  sl_checkpoint_stats latest_completed;
  int has_latest_failed;
  sl_checkpoint_stats latest_failed;
  /** With SL_METRICS_HISTORY: the newest checkpoints (up to 64), newest
   * first, and each one's instances: those of history[k] are
   * history_instances[k * history_instance_count + i], i in instance
   * order of sl_job_checkpoint_instance_stats(). */
  int history_count;
  sl_checkpoint_stats *history;
  int history_instance_count;
  sl_checkpoint_instance_stats *history_instances;
} sl_metrics;

/** sl_job_metrics() flag: copy the checkpoint history too (up to 64 x
 * instances entries: leave it out of frequent polls of a large job). */
#define SL_METRICS_HISTORY 0x1u

/** Take a snapshot of job into *out (any previous content is ignored:
 * free it first).  flags: 0 or SL_METRICS_HISTORY.
 *
 * Each counter is read once, with relaxed loads of what its instance last
 * published (at most one batch, or one pass over its inputs, old); times
 * are consistent per instance (busy + idle + backpressured = the thread's
 * lifetime at the moment of the read); the checkpoint figures are one
 * consistent copy.  Counters of different instances are not from one
 * instant.  After sl_job_wait() the figures are final and exact.
 *
 * Cost: O(instances + rings) loads, two allocations (three with the
 * history), and one short lock of the checkpoint history (taken only by the
 * coordinator, never by an instance thread).  Thread-safe: any thread, any
 * number at once, while the job runs and after it ended, until
 * sl_job_destroy().
 *
 * Returns 0; SL_ENOTSTARTED (the job was never started: *out holds the
 * state CREATED and no arrays, and needs no free), EINVAL (job or out
 * NULL, unknown flags), ENOMEM.  On error *out owns no memory. */
int sl_job_metrics(const sl_job *job, unsigned flags, sl_metrics *out);

/** Free the arrays of a snapshot and zero it.  NULL and a zeroed struct
 * are accepted. */
void sl_metrics_free(sl_metrics *m);

/** The Prometheus text (exposition format 0.0.4) that GET /metrics
 * serves, for a host that serves it from its own endpoint: every sample
 * carries the label job="NAME" (sl_job_config.name).  Prometheus sets a
 * target's own `job` label from its scrape config, so by default it keeps
 * sluice's as `exported_job`; set honor_labels: true in the scrape config
 * to keep it as `job`.  Available in every
 * build, also one without the HTTP endpoint (meson -Dhttp=disabled).
 * Takes one snapshot (sl_job_metrics) and, if the whole text and its
 * terminating NUL fit in buf_bytes, copies them into buf.  *needed is set
 * to the bytes that snapshot needed, NUL included, in both cases; the
 * next snapshot may need more (counters grow), so give a retry headroom.
 * buf NULL with buf_bytes 0 asks for the size only.  Returns 0, ENOSPC
 * (buf too small: nothing is written to buf), EINVAL (job or needed NULL,
 * or buf NULL with buf_bytes > 0), ENOMEM, or an error of
 * sl_job_metrics.  Any thread, any time until sl_job_destroy, like
 * sl_job_metrics; it never stalls an instance thread. */
int sl_metrics_prometheus(sl_job *job, char *buf, size_t buf_bytes,
                          size_t *needed);

/* ------------------------------------------------------------------------ */
/* HTTP endpoint (engine/http.c, libmicrohttpd).  An embedded server for
 * one job, on its own threads.  Optional at build time: a library built
 * with meson -Dhttp=disabled (or without libmicrohttpd) has no endpoint,
 * and sl_http_start / sl_http_start_with return ENOTSUP and log an ERROR
 * line saying why (sl_job_error(job) says so too while the job is still
 * being built: a started job's message is its run's, never overwritten);
 * sl_metrics_prometheus works in every build.
 *
 *
 *   GET  /metrics         Prometheus text exposition format 0.0.4, as
 *                         sl_metrics_prometheus renders it (job label)
 *   GET  /jobs            the job as JSON: state, uptime, restarts, last
 *                         failure, operators with their instances, totals
 *   GET  /checkpoints     JSON after Flink's /jobs/:id/checkpoints: counts,
 *                         latest, history (optional ?limit=N, 0 .. 64)
 *   POST /savepoints      write a savepoint below the savepoint root: the
 *                         query's dir=NAME or a JSON body {"dir": NAME}
 *                         names it relative to the root; without a name it
 *                         is savepoint-<checkpoint id>-<unix ms>
 *   POST /stop            stop the job with a savepoint there
 *                         (sl_job_stop_with_savepoint): named as for POST
 *                         /savepoints, plus drain=true|false (the query's
 *                         drain, or "drain" in the JSON body; default
 *                         false).  Answers once the stop is done: 200 with
 *                         {"checkpoint_id": N, "dir": NAME, "path": PATH,
 *                         "drain": BOOL}; 403 without a savepoint root;
 *                         409 when the job has not started, has ended or
 *                         another stop is under way, or the directory is
 *                         not empty (the job goes on); 500 when the stop
 *                         checkpoint failed (the job goes on)
 *
 * An unknown path gets 404, a wrong method 405 (with an Allow header), bad
 * parameters 400, each with a JSON body {"error": "..."}.  Handlers read
 * the job only through sl_job_metrics() (and the savepoint call), so the
 * endpoint never stalls an instance thread.
 *
 * Security rules (engine/http.c, notes 5 to 9), each refusal a JSON error:
 *
 * - Savepoints are written only below savepoint_root.  Without one, POST
 *   /savepoints and POST /stop get 403.  A name is refused (403) if it is absolute and
 *   not below the root, has an empty, "." or ".." component, a NUL (also
 *   as %00) or another control character, passes through a symbolic link
 *   (components are opened with O_NOFOLLOW), or lies inside the job's
 *   state directory or one of protected_dirs.
 * - Cross-site requests get 403: a POST whose Content-Type is a form type
 *   (application/x-www-form-urlencoded, multipart/form-data, text/plain),
 *   a request whose Origin is not the endpoint itself (http://ADDR:PORT of
 *   the address the client reached), and, on a loopback address, a Host
 *   that names neither that address nor localhost (DNS rebinding).
 * - A non-loopback address (0.0.0.0 and :: included) needs bearer_token;
 *   with a token every request needs "Authorization: Bearer TOKEN"
 *   (compared in constant time), else 401.
 * - A client has header_timeout_ms from connecting (or from its previous
 *   answer) to send a whole request, headers and body; then the connection
 *   is closed.  At most connections_per_client_max connections per client
 *   address and connections_max in all; more are closed at once.
 * - A Content-Length over 64 KiB gets 413 before any of the body is read;
 *   a chunked body that grows past it closes the connection. */

typedef struct sl_http sl_http;

/** Options of sl_http_start_with().  struct_bytes tells the library which
 * fields the caller knows: set it to sizeof(sl_http_options) (the
 * initializer SL_HTTP_OPTIONS_INIT does), so a program built against this
 * header keeps working with a later library that has more fields, which
 * then take their defaults.  Every field left zero means its default. */
typedef struct sl_http_options {
  size_t struct_bytes; /* sizeof(sl_http_options) */
  /** An IPv4 or IPv6 literal; NULL: "127.0.0.1". */
  const char *address;
  /** 0: an ephemeral port, see sl_http_port(). */
  int port;
  /** The directory savepoints are written below (created, with its
   * parents, if missing); NULL: POST /savepoints and POST /stop are
   * refused. */
  const char *savepoint_root;
  /** More directories no savepoint may be written into or below, NULL
   * terminated (the file sinks' output directories); the job's state
   * directory is always one.  May be NULL. */
  const char *const *protected_dirs;
  /** The bearer token every request must carry; NULL: none.  Required on
   * a non-loopback address.  16 to 1024 visible ASCII characters (0x21 ..
   * 0x7e).  Copied. */
  const char *bearer_token;
  /** Time to send a whole request (0: 5000 ms). */
  uint32_t header_timeout_ms;
  /** Connections at once (0: 64), and per client address (0: 8). */
  uint32_t connections_max;
  uint32_t connections_per_client_max;
} sl_http_options;

#define SL_HTTP_OPTIONS_INIT {.struct_bytes = sizeof(sl_http_options)}

/** Start a server for job with options (see sl_http_options).  The job
 * may be started before or after; the server must be stopped before
 * sl_job_destroy().  Errors: EINVAL (job, options or http NULL;
 * struct_bytes smaller than the first version of the struct, or larger
 * than this library's with nonzero bytes past it; address not a numeric IP
 * address; port outside 0 .. 65535; a malformed token; a limit above
 * 1024 connections or 600000 ms), SL_EUSAGE (a non-loopback address
 * without bearer_token), ENOTDIR / EACCES / ... (savepoint_root cannot be
 * created or is not a directory, or lies inside the state directory or a
 * protected directory: EINVAL), an errno of socket(), bind() or listen()
 * (EADDRINUSE, EACCES, ...), ENOMEM, EIO (the server could not start for
 * another reason), ENOTSUP (the library was built without the HTTP
 * endpoint: an ERROR line says so, and sl_job_error(job) too if the job
 * has not been started).  On error *http is NULL and
 * nothing is left running. */
int sl_http_start_with(sl_job *job, const sl_http_options *options,
                       sl_http **http);

/** sl_http_start_with() with only address and port set: no savepoint root
 * (POST /savepoints is refused) and no token (so loopback only). */
int sl_http_start(sl_job *job, const char *address, int port, sl_http **http);

/** The port the server listens on (the real one when started with 0). */
int sl_http_port(const sl_http *http);

/** Stop the server: waits for requests in progress (a savepoint request
 * may take as long as the savepoint), then frees it.  NULL is accepted. */
void sl_http_stop(sl_http *http);

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_METRICS_H */
