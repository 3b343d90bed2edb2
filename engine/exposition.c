/* exposition.c — a metrics snapshot (sl_metrics, metrics.c) as the
 * documents the HTTP endpoint serves (http.c): Prometheus text exposition
 * format 0.0.4 for /metrics, JSON for /jobs and /checkpoints.
 *
 * NOTES ON THE DESIGN
 *
 * 1. JSON is built with jansson only, so user text (operator names,
 *    failure messages) is always escaped.  A builder that runs out of
 *    memory returns NULL, never a partial document.
 * 2. The Prometheus text escapes label values (backslash, double quote,
 *    newline) and HELP text (backslash, newline) as format 0.0.4 says.
 *    Each family's HELP and TYPE lines come once, before all its samples;
 *    a family with no sample (watermarks of a job without event time) is
 *    left out whole.  Counters end in _total; times are in seconds,
 *    printed exactly from nanoseconds.
 * 4. Every sample's first label is job="NAME" (sl_job_config.name,
 *    default "sluice"), escaped as note 2 says, so the metrics of several
 *    jobs scraped into one Prometheus stay apart.
 * 3. JSON field names follow the C structures (sluice.h, "Metrics"), with
 *    Flink's shape for /checkpoints: counts, latest {completed, failed,
 *    restored}, history.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exposition.h"
#include "internal.h" /* SL_CHECKPOINT_HISTORY */

/* ------------------------------------------------------- JSON helpers */

/* JSON integers are signed 64-bit: counters beyond that saturate. */
static json_t *json_u64(uint64_t v) {
  return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *json_ms_from_ns(uint64_t ns) {
  return json_real((double)ns / 1e6);
}

/* A watermark: null for none (SL_WATERMARK_MIN). */
static json_t *json_watermark(int64_t watermark) {
  return watermark == SL_WATERMARK_MIN ? json_null() : json_integer(watermark);
}

/* Set key to value in obj; a NULL value (out of memory) marks the object
 * failed by setting *ok false. */
static void put(json_t *obj, const char *key, json_t *value, bool *ok) {
  if (!value || json_object_set_new(obj, key, value) != 0)
    *ok = false;
}

static void put_u64(json_t *obj, const char *key, uint64_t v, bool *ok) {
  put(obj, key, json_u64(v), ok);
}

/* The end of every builder below: obj if ok, else NULL with obj freed. */
static json_t *finish(json_t *obj, bool ok) {
  if (!ok)
    json_decref(obj);
  return ok ? obj : 0;
}

/* Set key to array in obj (which takes its own reference), drop the
 * builder's reference to array, and finish obj. */
static json_t *finish_with_array(json_t *obj, const char *key, json_t *array,
                                 bool ok) {
  if (ok)
    put(obj, key, json_incref(array), &ok);
  json_decref(array);
  return finish(obj, ok);
}

/* The record, byte and state counters of an operator (or of all of them),
 * in the order /jobs shows them. */
static void put_operator_counts(json_t *obj, const sl_operator_metrics *op,
                                bool *ok) {
  put_u64(obj, "records_in", op->records_in, ok);
  put_u64(obj, "records_out", op->records_out, ok);
  put_u64(obj, "bytes_in", op->bytes_in, ok);
  put_u64(obj, "bytes_out", op->bytes_out, ok);
  put_u64(obj, "state_entries", op->state_entries, ok);
  put_u64(obj, "state_bytes", op->state_bytes, ok);
  put_u64(obj, "late_records", op->late_records, ok);
  put_u64(obj, "dead_letters", op->dead_letters, ok);
}

/* ------------------------------------------------------- /jobs */

static json_t *instance_json(const sl_instance_metrics *i) {
  json_t *o = json_object();
  bool ok = o != 0;
  if (!o)
    return 0;
  put(o, "instance", json_integer(i->instance), &ok);
  put(o, "running", json_boolean(i->running), &ok);
  put_u64(o, "records_in", i->records_in, &ok);
  put_u64(o, "records_out", i->records_out, &ok);
  put_u64(o, "bytes_in", i->bytes_in, &ok);
  put_u64(o, "bytes_out", i->bytes_out, &ok);
  put(o, "busy_ms", json_ms_from_ns(i->busy_ns), &ok);
  put(o, "idle_ms", json_ms_from_ns(i->idle_ns), &ok);
  put(o, "backpressured_ms", json_ms_from_ns(i->backpressured_ns), &ok);
  put(o, "input_rings", json_integer(i->input_rings), &ok);
  put(o, "input_fill_ratio", json_real(i->input_fill_ratio), &ok);
  put(o, "input_fill_max_ratio", json_real(i->input_fill_max_ratio), &ok);
  put(o, "output_rings", json_integer(i->output_rings), &ok);
  put(o, "output_fill_max_ratio", json_real(i->output_fill_max_ratio), &ok);
  put(o, "watermark", json_watermark(i->watermark), &ok);
  put(o, "watermark_lag_ms",
      i->has_watermark_lag ? json_integer(i->watermark_lag_ms) : json_null(),
      &ok);
  put_u64(o, "state_entries", i->state_entries, &ok);
  put_u64(o, "state_bytes", i->state_bytes, &ok);
  put_u64(o, "late_records", i->late_records, &ok);
  put_u64(o, "dead_letters", i->dead_letters, &ok);
  return finish(o, ok);
}

static json_t *operator_json(const sl_metrics *m, int index) {
  const sl_operator_metrics *op = &m->operators[index];
  json_t *o = json_object();
  json_t *instances = json_array();
  bool ok = o && instances;
  if (o) {
    put(o, "name", json_string(op->name), &ok);
    put(o, "index", json_integer(index), &ok);
    put(o, "parallelism", json_integer(op->parallelism), &ok);
    put_operator_counts(o, op, &ok);
    put(o, "watermark", json_watermark(op->watermark), &ok);
  }
  for (int k = 0; ok && k < op->parallelism; k++) {
    json_t *i = instance_json(&m->instances[op->first_instance + k]);
    ok = i && json_array_append_new(instances, i) == 0;
  }
  return finish_with_array(o, "instances", instances, ok);
}

static json_t *totals_json(const sl_metrics *m) {
  sl_operator_metrics sum = {0};
  for (int i = 0; i < m->operator_count; i++) {
    const sl_operator_metrics *op = &m->operators[i];
    sum.records_in += op->records_in;
    sum.records_out += op->records_out;
    sum.bytes_in += op->bytes_in;
    sum.bytes_out += op->bytes_out;
    sum.state_entries += op->state_entries;
    sum.state_bytes += op->state_bytes;
    sum.late_records += op->late_records;
    sum.dead_letters += op->dead_letters;
  }
  json_t *o = json_object();
  bool ok = o != 0;
  if (!o)
    return 0;
  put_u64(o, "source_records", m->source_records, &ok);
  put_operator_counts(o, &sum, &ok);
  put(o, "instances", json_integer(m->instance_count), &ok);
  return finish(o, ok);
}

static json_t *failure_json(const sl_metrics *m) {
  if (m->last_failure_status == 0 && !m->last_failure[0])
    return json_null();
  return json_pack("{s:i,s:s,s:s}", "status", m->last_failure_status,
                   "error", sl_strerror(m->last_failure_status), "cause",
                   m->last_failure);
}

static json_t *checkpoint_summary_json(const sl_metrics *m) {
  return json_pack("{s:b,s:I,s:I,s:I,s:I,s:I,s:I}", "enabled",
                   m->checkpointing, "completed",
                   (json_int_t)m->checkpoints_completed, "failed",
                   (json_int_t)m->checkpoints_failed, "in_progress",
                   (json_int_t)m->checkpoints_in_progress, "total",
                   (json_int_t)m->checkpoints_total, "latest_completed_id",
                   (json_int_t)(m->has_latest_completed
                                    ? m->latest_completed.id
                                    : 0),
                   "restored_from", (json_int_t)m->restored_from);
}

json_t *sl_exposition_jobs(const sl_metrics *m) {
  assert(m->operator_count >= 1 && m->instance_count >= m->operator_count);
  json_t *o = json_object();
  json_t *ops = json_array();
  bool ok = o && ops;
  if (o) {
    put(o, "state", json_string(sl_job_status_name(m->state)), &ok);
    put(o, "start_time_ms", json_integer(m->start_time_ms), &ok);
    put(o, "now_ms", json_integer(m->time_ms), &ok);
    put(o, "uptime_ms", json_ms_from_ns(m->uptime_ns), &ok);
    put(o, "restarts", json_integer(m->restarts), &ok);
    put_u64(o, "faults_fired", m->faults_fired, &ok);
    put(o, "last_failure", failure_json(m), &ok);
    put(o, "totals", totals_json(m), &ok);
    put(o, "checkpoints", checkpoint_summary_json(m), &ok);
  }
  for (int i = 0; ok && i < m->operator_count; i++) {
    json_t *op = operator_json(m, i);
    ok = op && json_array_append_new(ops, op) == 0;
  }
  return finish_with_array(o, "operators", ops, ok);
}

/* ------------------------------------------------------- /checkpoints */

static const char *checkpoint_status_name(int status) {
  switch (status) {
  case SL_CHECKPOINT_COMPLETED:
    return "COMPLETED";
  case SL_CHECKPOINT_ABORTED:
    return "FAILED";
  default:
    return "IN_PROGRESS";
  }
}

/* Every field of sl_checkpoint_stats (status as Flink's name). */
static json_t *checkpoint_json(const sl_checkpoint_stats *c) {
  return json_pack("{s:I,s:s,s:b,s:I,s:I,s:I,s:I,s:I,s:i,s:s,s:b,s:I}", "id",
                   (json_int_t)c->id, "status",
                   checkpoint_status_name(c->status), "final", c->final,
                   "trigger_time_ms", (json_int_t)c->trigger_time_ms,
                   "duration_us", (json_int_t)c->duration_us, "write_us",
                   (json_int_t)c->write_us, "bytes_persisted",
                   (json_int_t)c->bytes_persisted, "entries_persisted",
                   (json_int_t)c->entries_persisted, "instance_count",
                   c->instance_count, "cause", c->cause, "unaligned",
                   c->unaligned, "channel_bytes", (json_int_t)c->channel_bytes);
}

static json_t *checkpoint_instance_json(const sl_checkpoint_instance_stats *s) {
  return json_pack("{s:s,s:i,s:I,s:I,s:I,s:I,s:I,s:I}", "operator",
                   s->name ? s->name : "", "instance", s->instance,
                   "start_delay_us", (json_int_t)s->start_delay_us,
                   "alignment_us", (json_int_t)s->alignment_us, "sync_us",
                   (json_int_t)s->sync_us, "async_us",
                   (json_int_t)s->async_us, "bytes_persisted",
                   (json_int_t)s->bytes_persisted, "entries_persisted",
                   (json_int_t)s->entries_persisted);
}

static json_t *history_entry_json(const sl_metrics *m, int k) {
  json_t *o = checkpoint_json(&m->history[k]);
  json_t *instances = json_array();
  bool ok = o && instances;
  int n = m->history_instance_count;
  for (int i = 0; ok && i < n; i++) {
    json_t *s =
        checkpoint_instance_json(&m->history_instances[(size_t)k * n + i]);
    ok = s && json_array_append_new(instances, s) == 0;
  }
  return finish_with_array(o, "instances", instances, ok);
}

static json_t *latest_json(const sl_metrics *m) {
  json_t *o = json_object();
  bool ok = o != 0;
  if (!o)
    return 0;
  put(o, "completed",
      m->has_latest_completed ? checkpoint_json(&m->latest_completed)
                              : json_null(),
      &ok);
  put(o, "failed",
      m->has_latest_failed ? checkpoint_json(&m->latest_failed) : json_null(),
      &ok);
  put(o, "restored",
      m->restored_from ? json_pack("{s:I}", "id", (json_int_t)m->restored_from)
                       : json_null(),
      &ok);
  return finish(o, ok);
}

json_t *sl_exposition_checkpoints(const sl_metrics *m, int limit) {
  assert(limit >= 0 && limit <= SL_CHECKPOINT_HISTORY);
  assert(m->history_count <= SL_CHECKPOINT_HISTORY);
  json_t *o = json_object();
  json_t *history = json_array();
  bool ok = o && history;
  if (o) {
    put(o, "enabled", json_boolean(m->checkpointing), &ok);
    put(o, "counts",
        json_pack("{s:I,s:I,s:I,s:I}", "completed",
                  (json_int_t)m->checkpoints_completed, "failed",
                  (json_int_t)m->checkpoints_failed, "in_progress",
                  (json_int_t)m->checkpoints_in_progress, "total",
                  (json_int_t)m->checkpoints_total),
        &ok);
    put(o, "latest", latest_json(m), &ok);
  }
  for (int k = 0; ok && k < m->history_count && k < limit; k++) {
    json_t *h = history_entry_json(m, k);
    ok = h && json_array_append_new(history, h) == 0;
  }
  return finish_with_array(o, "history", history, ok);
}

/* ------------------------------------------------------- Prometheus text */

typedef struct prom_text {
  char *data;
  size_t used;
  size_t capacity;
  bool failed; /* out of memory: the text is incomplete */
  /* `job="NAME"`, NAME escaped (note 4): the first label of every sample.
   * Each name byte takes at most 2 escaped. */
  char job_label[8 + 2 * SL_MAX_NAME];
} prom_text;

static void text_printf(prom_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void text_printf(prom_text *t, const char *fmt, ...) {
  assert(t->used <= t->capacity);
  for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
    size_t room = t->capacity - t->used;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->data ? t->data + t->used : 0, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      t->failed = true;
      return;
    }
    if ((size_t)n < room) {
      t->used += (size_t)n;
      return;
    }
    /* Grow to fit (at least double), then print again: one retry. */
    size_t want = t->used + (size_t)n + 1;
    size_t capacity = t->capacity ? t->capacity * 2 : 16384;
    while (capacity < want)
      capacity *= 2;
    char *data = realloc(t->data, capacity);
    if (!data) {
      t->failed = true;
      return;
    }
    t->data = data;
    t->capacity = capacity;
  }
}

/* value with backslash, double quote and newline escaped (label values;
 * HELP text escapes the same minus the quote, and has none). */
static void text_escaped(prom_text *t, const char *value) {
  for (const char *p = value; *p && !t->failed; p++) {
    if (*p == '\\')
      text_printf(t, "\\\\");
    else if (*p == '"')
      text_printf(t, "\\\"");
    else if (*p == '\n')
      text_printf(t, "\\n");
    else
      text_printf(t, "%c", *p);
  }
}

static void text_family(prom_text *t, const char *name, const char *type,
                        const char *help) {
  text_printf(t, "# HELP %s ", name);
  text_escaped(t, help);
  text_printf(t, "\n# TYPE %s %s\n", name, type);
}

/* A family with one sample labelled with the job only: HELP, TYPE, then
 * `name{job="NAME"} value`. */
static void text_single_u64(prom_text *t, const char *name, const char *type,
                            const char *help, uint64_t value) {
  text_family(t, name, type, help);
  text_printf(t, "%s{%s} %" PRIu64 "\n", name, t->job_label, value);
}

/* Nanoseconds as exact decimal seconds. */
static void text_seconds(prom_text *t, uint64_t ns) {
  text_printf(t, "%" PRIu64 ".%09" PRIu64, ns / 1000000000u,
              ns % 1000000000u);
}

/* A gauge with one sample (the job label only) of ns in exact decimal
 * seconds. */
static void text_single_seconds(prom_text *t, const char *name,
                                const char *help, uint64_t ns) {
  text_family(t, name, "gauge", help);
  text_printf(t, "%s{%s} ", name, t->job_label);
  text_seconds(t, ns);
  text_printf(t, "\n");
}

/* The per-instance families, each with its samples together (a family's
 * TYPE line comes once, before them). */
enum instance_field {
  F_RECORDS_IN, F_RECORDS_OUT, F_BYTES_IN, F_BYTES_OUT, F_BUSY, F_IDLE,
  F_BACKPRESSURED, F_INPUT_FILL, F_INPUT_FILL_MAX, F_OUTPUT_FILL_MAX,
  F_WATERMARK, F_WATERMARK_LAG, F_STATE_ENTRIES, F_STATE_BYTES, F_LATE,
  F_DEAD_LETTERS, F_RUNNING,
};

static const struct instance_family {
  const char *name;
  const char *type;
  enum instance_field field;
  const char *help;
} instance_families[] = {
    {"sluice_instance_records_in_total", "counter", F_RECORDS_IN,
     "Records the instance received."},
    {"sluice_instance_records_out_total", "counter", F_RECORDS_OUT,
     "Records the instance emitted."},
    {"sluice_instance_bytes_in_total", "counter", F_BYTES_IN,
     "Payload bytes of the records received."},
    {"sluice_instance_bytes_out_total", "counter", F_BYTES_OUT,
     "Payload bytes of the records emitted."},
    {"sluice_instance_busy_seconds_total", "counter", F_BUSY,
     "Time the instance's thread was neither idle nor backpressured."},
    {"sluice_instance_idle_seconds_total", "counter", F_IDLE,
     "Time the instance waited for input."},
    {"sluice_instance_backpressured_seconds_total", "counter",
     F_BACKPRESSURED, "Time the instance waited for room on a full output "
     "ring."},
    {"sluice_instance_input_fill_ratio", "gauge", F_INPUT_FILL,
     "Mean fill (0 to 1) of the instance's input rings."},
    {"sluice_instance_input_fill_max_ratio", "gauge", F_INPUT_FILL_MAX,
     "Fill (0 to 1) of the instance's fullest input ring."},
    {"sluice_instance_output_fill_max_ratio", "gauge", F_OUTPUT_FILL_MAX,
     "Fill (0 to 1) of the instance's fullest output ring."},
    {"sluice_instance_watermark", "gauge", F_WATERMARK,
     "Current input watermark, in event-time units."},
    {"sluice_instance_watermark_lag_seconds", "gauge", F_WATERMARK_LAG,
     "Wall clock minus the watermark (event time as ms since the epoch)."},
    {"sluice_instance_state_entries", "gauge", F_STATE_ENTRIES,
     "Live keys in the instance's keyed state."},
    {"sluice_instance_state_bytes", "gauge", F_STATE_BYTES,
     "Memory held by the instance's keyed state."},
    {"sluice_instance_late_records_total", "counter", F_LATE,
     "Records behind the watermark (dropped or sent to a side output)."},
    {"sluice_instance_dead_letters_total", "counter", F_DEAD_LETTERS,
     "Malformed records set aside."},
    {"sluice_instance_running", "gauge", F_RUNNING,
     "1 while the instance's thread runs."},
};

static void text_ratio(prom_text *t, double v) {
  text_printf(t, "%.6g", isfinite(v) ? v : 0.0);
}

/* The sample value of field for i; false if i has none (no sample). */
static bool instance_value(prom_text *t, const sl_instance_metrics *i,
                           enum instance_field field) {
  uint64_t u = 0;
  switch (field) {
  case F_RECORDS_IN: u = i->records_in; break;
  case F_RECORDS_OUT: u = i->records_out; break;
  case F_BYTES_IN: u = i->bytes_in; break;
  case F_BYTES_OUT: u = i->bytes_out; break;
  case F_STATE_ENTRIES: u = i->state_entries; break;
  case F_STATE_BYTES: u = i->state_bytes; break;
  case F_LATE: u = i->late_records; break;
  case F_DEAD_LETTERS: u = i->dead_letters; break;
  case F_RUNNING: u = (uint64_t)(i->running != 0); break;
  case F_BUSY: text_seconds(t, i->busy_ns); return true;
  case F_IDLE: text_seconds(t, i->idle_ns); return true;
  case F_BACKPRESSURED: text_seconds(t, i->backpressured_ns); return true;
  case F_INPUT_FILL: text_ratio(t, i->input_fill_ratio); return true;
  case F_INPUT_FILL_MAX: text_ratio(t, i->input_fill_max_ratio); return true;
  case F_OUTPUT_FILL_MAX: text_ratio(t, i->output_fill_max_ratio); return true;
  case F_WATERMARK:
    text_printf(t, "%" PRId64, i->watermark);
    return true;
  case F_WATERMARK_LAG:
    text_printf(t, "%.3f", (double)i->watermark_lag_ms / 1e3);
    return true;
  }
  text_printf(t, "%" PRIu64, u);
  return true;
}

static bool instance_has(const sl_instance_metrics *i,
                         enum instance_field field) {
  if (field == F_WATERMARK)
    return i->watermark != SL_WATERMARK_MIN &&
           i->watermark != SL_WATERMARK_MAX;
  if (field == F_WATERMARK_LAG)
    return i->has_watermark_lag != 0;
  return true;
}

static void instance_samples(prom_text *t, const sl_metrics *m) {
  size_t n = sizeof instance_families / sizeof instance_families[0];
  for (size_t f = 0; f < n; f++) {
    const struct instance_family *fam = &instance_families[f];
    bool any = false;
    for (int k = 0; k < m->instance_count; k++)
      any = any || instance_has(&m->instances[k], fam->field);
    if (!any)
      continue; /* no TYPE line without a sample */
    text_family(t, fam->name, fam->type, fam->help);
    for (int k = 0; k < m->instance_count; k++) {
      const sl_instance_metrics *i = &m->instances[k];
      if (!instance_has(i, fam->field))
        continue;
      text_printf(t, "%s{%s,operator=\"", fam->name, t->job_label);
      text_escaped(t, i->name);
      text_printf(t, "\",instance=\"%d\"} ", i->instance);
      instance_value(t, i, fam->field);
      text_printf(t, "\n");
    }
  }
}

static void job_samples(prom_text *t, const sl_metrics *m) {
  text_family(t, "sluice_job_info", "gauge",
              "The job's state, as a label; the value is always 1.");
  text_printf(t, "sluice_job_info{%s,state=\"%s\"} 1\n", t->job_label,
              sl_job_status_name(m->state));
  text_family(t, "sluice_job_start_time_seconds", "gauge",
              "When the job started, seconds since the epoch.");
  text_printf(t, "sluice_job_start_time_seconds{%s} %.3f\n", t->job_label,
              (double)m->start_time_ms / 1e3);
  text_single_seconds(t, "sluice_job_uptime_seconds",
                      "Time since the job started (until it ended).",
                      m->uptime_ns);
  text_single_u64(t, "sluice_job_source_records_total", "counter",
                  "Records emitted by every source instance.",
                  m->source_records);
  text_single_u64(t, "sluice_job_restarts_total", "counter",
                  "Restarts after failures (failover).", (uint64_t)m->restarts);
  text_single_u64(t, "sluice_job_faults_fired_total", "counter",
                  "Injected faults that fired.", m->faults_fired);
}

static void checkpoint_samples(prom_text *t, const sl_metrics *m,
                               uint64_t captures_aborted) {
  if (!m->checkpointing)
    return;
  text_family(t, "sluice_job_checkpoints_total", "counter",
              "Checkpoints that ended, by how.");
  text_printf(t,
              "sluice_job_checkpoints_total{%s,status=\"completed\"} %" PRIu64
              "\nsluice_job_checkpoints_total{%s,status=\"failed\"} %" PRIu64
              "\n",
              t->job_label, m->checkpoints_completed, t->job_label,
              m->checkpoints_failed);
  text_single_u64(t, "sluice_job_checkpoints_in_progress", "gauge",
                  "Checkpoints triggered and not yet ended.",
                  m->checkpoints_in_progress);
  text_single_u64(t, "sluice_job_unaligned_captures_aborted_total", "counter",
                  "Captures of channel state that unaligned checkpoints "
                  "dropped when they aborted (sl_job_captures_aborted).",
                  captures_aborted);
  text_single_u64(t, "sluice_job_checkpoint_restored_id", "gauge",
                  "Checkpoint the newest attempt started from (0: none).",
                  m->restored_from);
  if (!m->has_latest_completed)
    return;
  const sl_checkpoint_stats *c = &m->latest_completed;
  text_single_u64(t, "sluice_job_last_checkpoint_id", "gauge",
                  "Id of the newest completed checkpoint.", c->id);
  text_single_seconds(t, "sluice_job_last_checkpoint_duration_seconds",
                      "Trigger to durable commit of the newest completed "
                      "checkpoint.",
                      c->duration_us * 1000u);
  text_single_u64(t, "sluice_job_last_checkpoint_size_bytes", "gauge",
                  "Bytes the newest completed checkpoint persisted.",
                  c->bytes_persisted);
  text_family(t, "sluice_job_last_checkpoint_timestamp_seconds", "gauge",
              "When the newest completed checkpoint was triggered, seconds "
              "since the epoch.");
  text_printf(t, "sluice_job_last_checkpoint_timestamp_seconds{%s} %.3f\n",
              t->job_label, (double)c->trigger_time_ms / 1e3);
}

/* Note 4: job="NAME" with NAME's backslashes, quotes and newlines
 * escaped, into t->job_label. */
static void job_label_set(prom_text *t, const char *job_name) {
  assert(job_name && job_name[0]);
  assert(strlen(job_name) < SL_MAX_NAME);
  size_t at = (size_t)snprintf(t->job_label, sizeof t->job_label, "job=\"");
  for (const char *p = job_name; *p; p++) {
    const char *escaped = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" :
                          *p == '\n' ? "\\n" : 0;
    if (escaped) {
      memcpy(t->job_label + at, escaped, 2);
      at += 2;
    } else {
      t->job_label[at++] = *p;
    }
  }
  t->job_label[at++] = '"';
  t->job_label[at] = 0;
  assert(at < sizeof t->job_label);
}

char *sl_exposition_prometheus(const sl_metrics *m, const char *job_name,
                               uint64_t captures_aborted, size_t *bytes) {
  assert(m->instances && m->operators);
  prom_text t = {0};
  job_label_set(&t, job_name);
  job_samples(&t, m);
  checkpoint_samples(&t, m, captures_aborted);
  instance_samples(&t, m);
  if (t.failed) {
    free(t.data);
    return 0;
  }
  *bytes = t.used;
  return t.data;
}

/* sluice_metrics.h: the text of GET /metrics for a host's own endpoint.
 * One snapshot, rendered, then copied only if it fits whole (with its
 * NUL): a caller never gets a cut document. */
SL_EXPORT int sl_metrics_prometheus(sl_job *job, char *buf, size_t buf_bytes,
                                    size_t *needed) {
  if (!job || !needed || (!buf && buf_bytes > 0))
    return EINVAL;
  *needed = 0;
  sl_metrics m;
  int rc = sl_job_metrics(job, 0, &m);
  if (rc)
    return rc;
  size_t bytes = 0;
  char *text = sl_exposition_prometheus(&m, job->name,
                                        sl_job_captures_aborted(job), &bytes);
  sl_metrics_free(&m);
  if (!text)
    return ENOMEM;
  *needed = bytes + 1;
  if (buf_bytes < bytes + 1) {
    free(text);
    return ENOSPC;
  }
  memcpy(buf, text, bytes);
  buf[bytes] = 0;
  free(text);
  return 0;
}
