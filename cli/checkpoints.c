/* checkpoints.c — `sluice checkpoints DIR`: what a state directory (or a
 * savepoint) holds, read without changing anything (engine/inspect.h).
 *
 *   sluice checkpoints DIR            the checkpoints (newest first), the
 *                                     operators, the source positions and
 *                                     sizes of the newest, the savepoints
 *   sluice checkpoints DIR --id N     one checkpoint in detail
 *   sluice checkpoints SAVEPOINT_DIR  its manifest and the checkpoint in it
 *   --json                            one JSON object instead of text
 *   sluice checkpoints --upgrade DIR  convert a store of format 2 in
 *                                     place (upgrade.c)
 *
 * Everything is read first and printed after, so an error (exit status 1,
 * one line on stderr naming the file and the problem) prints no partial
 * listing.  Usage errors exit with 2.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "cli_util.h"
#include "inspect.h"

#define DEFAULT_LIMIT 20u
#define ERR_BYTES 1536

typedef struct request {
  const char *dir;
  bool json;
  bool has_id;
  uint64_t id;
  uint64_t limit; /* checkpoints listed; 0: all */
  bool upgrade;   /* --upgrade: convert, list nothing (upgrade.c) */
} request;

/* What was read, all of it before anything is printed. */
typedef struct inspection {
  sl_state_dir *sd;
  const sl_state_dir_info *info;
  sl_inspect_checkpoint *records; /* newest first, up to shown */
  size_t shown;
  sl_savepoint_entry *savepoints;
  size_t savepoint_count;
  bool has_manifest;
  sl_savepoint_manifest manifest;
} inspection;

static void checkpoints_usage(FILE *out) {
  fprintf(out,
          "usage: sluice checkpoints DIR [--id N] [--limit N | --all] [--json]\n"
          "       sluice checkpoints --upgrade DIR\n"
          "\n"
          "Lists the checkpoints of a state directory, newest first: id, trigger\n"
          "time (UTC), status (latest = restorable, superseded = its record only),\n"
          "the operators, the source positions and blob sizes of the newest, the\n"
          "store's size and the savepoints listed in DIR/savepoints.jsonl.  DIR may\n"
          "also be a savepoint (a directory with manifest.json).  Reads only: safe\n"
          "while a job runs on DIR.\n"
          "\n"
          "  --id N       one checkpoint in detail\n"
          "  --limit N    list the newest N checkpoints (default 20)\n"
          "  --all        list every checkpoint\n"
          "  --json       one JSON object\n"
          "  --upgrade    convert DIR's store of the older format 2 into this\n"
          "               sluice's format, in place (a crash leaves either\n"
          "               the old or the new store); refuses a store in use;\n"
          "               nothing to do on a store of this format\n"
          "\n"
          "Exit status: 0 success, 1 the directory or a file in it cannot be read\n"
          "(not a store, corrupt, no such checkpoint), 2 a usage error.\n");
}

static void parse_request(int argc, char **argv, request *r) {
  r->limit = DEFAULT_LIMIT;
  bool limit_given = false;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
      checkpoints_usage(stdout), exit(0);
    else if (strcmp(a, "--json") == 0)
      r->json = true;
    else if (strcmp(a, "--id") == 0)
      r->id = parse_u64(a, v, 1, UINT64_MAX), r->has_id = true, i++;
    else if (strcmp(a, "--limit") == 0)
      r->limit = parse_u64(a, v, 1, UINT64_MAX), limit_given = true, i++;
    else if (strcmp(a, "--upgrade") == 0)
      r->upgrade = true;
    else if (strcmp(a, "--all") == 0)
      r->limit = 0, limit_given = true;
    else if (a[0] == '-')
      die_usage("checkpoints: unknown option '%s'", a);
    else if (r->dir)
      die_usage("checkpoints: one directory only ('%s' and '%s')", r->dir, a);
    else
      r->dir = a;
  }
  if (!r->dir)
    die_usage("checkpoints needs a state directory");
  if (r->upgrade && (r->json || r->has_id || limit_given))
    die_usage("checkpoints: --upgrade takes only the directory");
  if (r->json && !limit_given)
    r->limit = 0; /* machines get everything */
}

/* ------------------------------------------------------------ reading */

static int error_out(const char *message) {
  fprintf(stderr, "sluice: checkpoints: %s\n", message);
  return 1;
}

/* The records to show (newest first) into in->records. */
static int read_records(inspection *in, const request *r, char *err) {
  const sl_state_dir_info *info = in->info;
  size_t n = info->checkpoint_count;
  if (r->has_id)
    n = 1;
  else if (r->limit && n > r->limit)
    n = (size_t)r->limit;
  in->records = calloc(n + 1, sizeof *in->records);
  if (!in->records)
    return snprintf(err, ERR_BYTES, "out of memory"), ENOMEM;
  for (size_t k = 0; k < n; k++) { /* bounded by the listed ids */
    uint64_t id = r->has_id ? r->id
                            : info->checkpoint_ids[info->checkpoint_count - 1 - k];
    int rc = sl_state_dir_checkpoint(in->sd, id, &in->records[k], err,
                                     ERR_BYTES);
    if (rc)
      return rc;
  }
  in->shown = n;
  return 0;
}

static int read_savepoints(inspection *in, const char *dir, char *err) {
  int rc = sl_savepoints_read(dir, &in->savepoints, &in->savepoint_count, err,
                              ERR_BYTES);
  return rc == ENOENT ? 0 : rc; /* no index: no savepoints */
}

/* A savepoint: its manifest, and its store must hold the checkpoint the
 * manifest names. */
static int read_manifest(inspection *in, const char *dir, char *err,
                         const char **store_dir) {
  int rc = sl_savepoint_manifest_read(dir, &in->manifest, err, ERR_BYTES);
  in->has_manifest = true;
  if (rc)
    return rc;
  if (!in->manifest.store_dir[0]) {
    snprintf(err, ERR_BYTES, "%s: a savepoint manifest, but no data.mdb in "
             "the directory or a subdirectory of it", dir);
    return SL_ESTORE;
  }
  *store_dir = in->manifest.store_dir;
  return 0;
}

static int inspect(inspection *in, const request *r, char *err) {
  const char *store_dir = r->dir;
  bool savepoint = sl_savepoint_is_dir(r->dir);
  int rc = savepoint ? read_manifest(in, r->dir, err, &store_dir) : 0;
  if (rc == 0)
    rc = sl_state_dir_open(store_dir,
                           savepoint ? SL_STATE_DIR_NO_LOCK_FILE : 0, &in->sd,
                           err, ERR_BYTES);
  if (rc == 0)
    in->info = sl_state_dir_info_get(in->sd);
  if (rc == 0 && savepoint &&
      in->manifest.checkpoint_id != in->info->latest) {
    snprintf(err, ERR_BYTES, "%s: the manifest names checkpoint %" PRIu64
             " but the store holds %" PRIu64, r->dir,
             in->manifest.checkpoint_id, in->info->latest);
    return SL_ECORRUPT;
  }
  if (rc == 0)
    rc = read_records(in, r, err);
  if (rc == 0 && !savepoint)
    rc = read_savepoints(in, r->dir, err);
  return rc;
}

static void inspection_free(inspection *in) {
  sl_state_dir_close(in->sd);
  free(in->records);
  free(in->savepoints);
  if (in->has_manifest)
    sl_savepoint_manifest_free(&in->manifest);
}

/* ------------------------------------------------------------ text */

static const char *status_of(const inspection *in, uint64_t id) {
  return id == in->info->latest ? "latest" : "superseded";
}

static const char *operator_name(const inspection *in,
                                 const sl_inspect_blob *b) {
  return b->operator_index >= 0 ? in->info->operators[b->operator_index].name
                                : "?";
}

static const char *operator_kind(const inspection *in,
                                 const sl_inspect_blob *b) {
  return b->operator_index >= 0 ? in->info->operators[b->operator_index].kind
                                : "?";
}

/* A source's "position 5000" (its first state word, with all of them
 * when there are more), else "state 96 bytes" or "no operator state",
 * into out. */
static void blob_state_text(const sl_inspect_blob *b, bool source, char *out,
                            size_t n) {
  int used = 0;
  if (source && b->position_words) {
    used = snprintf(out, n, "position %" PRIu64, b->position[0]);
    for (int w = 0; b->position_words > 1 && w < b->position_words &&
                    used >= 0 && (size_t)used < n;
         w++)
      used += snprintf(out + used, n - (size_t)used, "%s%" PRIu64,
                       w == 0 ? " (state words: " : " ", b->position[w]);
    if (b->position_words > 1 && used >= 0 && (size_t)used < n)
      used += snprintf(out + used, n - (size_t)used, ")");
  } else if (b->has_state) {
    used = snprintf(out, n, "state %" PRIu32 " bytes", b->state_bytes);
  } else {
    used = snprintf(out, n, "no operator state");
  }
  if (b->channel_bytes && used >= 0 && (size_t)used < n)
    used += snprintf(out + used, n - (size_t)used,
                     ", channel state %" PRIu64 " bytes", b->channel_bytes);
  if (!b->has_event_time || used < 0 || (size_t)used >= n)
    return;
  if (b->watermark == SL_WATERMARK_MAX)
    snprintf(out + used, n - (size_t)used, ", watermark: end of input");
  else if (b->watermark == SL_WATERMARK_MIN)
    snprintf(out + used, n - (size_t)used, ", watermark: none yet");
  else
    snprintf(out + used, n - (size_t)used, ", watermark %" PRId64,
             b->watermark);
}

static void print_store(const inspection *in) {
  const sl_state_dir_info *info = in->info;
  printf("state directory %s\n", info->path);
  printf("  store: format %" PRIu32 ", data.mdb %" PRIu64 " bytes (%.1f MiB), "
         "keyed state %" PRIu64 " entries at most (%" PRIu64 " compacted + %"
         PRIu64 " logged changes), %" PRIu64 " table entries\n",
         info->store_format, info->data_bytes,
         (double)info->data_bytes / (1 << 20),
         info->base_entries + info->log_entries, info->base_entries,
         info->log_entries, info->table_entries);
  if (info->operator_count == 0) {
    printf("  graph: %s\n", info->graph);
    return;
  }
  printf("  operators (max_parallelism %" PRIu32 "):\n", info->max_parallelism);
  printf("    %4s  %-20s %-9s %s\n", "id", "name", "kind", "parallelism");
  for (int i = 0; i < info->operator_count; i++)
    printf("    %4d  %-20s %-9s %d\n", info->operators[i].id,
           info->operators[i].name, info->operators[i].kind,
           info->operators[i].parallelism);
}

static void print_list(const inspection *in) {
  const sl_state_dir_info *info = in->info;
  printf("  checkpoints: %zu, newest complete %" PRIu64 "\n",
         info->checkpoint_count, info->latest);
  if (in->shown)
    printf("    %8s  %-24s  %-10s  %-5s  %9s  %12s  %10s\n", "id",
           "time (UTC)", "status", "final", "instances", "bytes", "entries");
  for (size_t k = 0; k < in->shown; k++) {
    const sl_inspect_checkpoint *c = &in->records[k];
    char time_text[40], bytes[24] = "-", entries[24] = "-";
    if (c->has_sizes) { /* record version 2 */
      snprintf(bytes, sizeof bytes, "%" PRIu64, c->bytes_persisted);
      snprintf(entries, sizeof entries, "%" PRIu64, c->entries_persisted);
    }
    printf("    %8" PRIu64 "  %-24s  %-10s  %-5s  %9" PRIu64 "  %12s  %10s\n",
           c->id,
           sl_inspect_time_text(c->trigger_time_ms, time_text,
                                sizeof time_text),
           status_of(in, c->id), c->final ? "yes" : "no", c->instance_count,
           bytes, entries);
    if (c->unaligned) /* record version 3 */
      printf("              unaligned: %" PRIu64 " bytes of channel state\n",
             c->channel_bytes);
  }
  if (in->shown < info->checkpoint_count)
    printf("    (%zu older not shown; --all shows them)\n",
           info->checkpoint_count - in->shown);
}

/* Source positions of the newest checkpoint (the only one with blobs). */
static void print_sources(const inspection *in) {
  const sl_state_dir_info *info = in->info;
  uint64_t bytes = 0;
  for (int i = 0; i < info->blob_count; i++)
    bytes += info->blobs[i].bytes;
  if (info->blob_count == 0)
    return;
  printf("  newest checkpoint %" PRIu64 ": %d instance blobs, %" PRIu64
         " bytes; source positions:\n", info->latest, info->blob_count, bytes);
  for (int i = 0; i < info->blob_count; i++) {
    const sl_inspect_blob *b = &info->blobs[i];
    if (strcmp(operator_kind(in, b), "source") != 0)
      continue;
    char state[200];
    blob_state_text(b, true, state, sizeof state);
    printf("    %s#%d  %s\n", operator_name(in, b), b->instance, state);
  }
}

static void print_savepoints(const inspection *in) {
  if (!in->savepoint_count)
    return;
  printf("  savepoints (savepoints.jsonl):\n");
  for (size_t i = 0; i < in->savepoint_count; i++) {
    const sl_savepoint_entry *e = &in->savepoints[i];
    char time_text[40];
    struct stat st;
    printf("    checkpoint %" PRIu64 "  %s  %" PRIu64 " bytes  %s%s\n",
           e->checkpoint_id,
           sl_inspect_time_text(e->created_ms, time_text, sizeof time_text),
           e->bytes, e->path, stat(e->path, &st) == 0 ? "" : "  (missing)");
  }
}

static void print_manifest(const sl_savepoint_manifest *m, const char *dir) {
  char time_text[40];
  printf("savepoint %s\n", dir);
  printf("  manifest: format %s version %" PRIu32 ", store format %" PRIu32
         ", checkpoint %" PRIu64 ", created %s, %" PRIu64 " bytes, "
         "max_parallelism %" PRIu32 ", %d operators\n",
         m->format, m->version, m->store_format, m->checkpoint_id,
         sl_inspect_time_text(m->created_ms, time_text, sizeof time_text),
         m->bytes, m->max_parallelism, m->operator_count);
  printf("  store copy: %s\n", m->store_dir);
}

/* --id N: the record and, for the newest, every instance's blob. */
static void print_detail(const inspection *in) {
  const sl_inspect_checkpoint *c = &in->records[0];
  const sl_state_dir_info *info = in->info;
  char time_text[40];
  printf("checkpoint %" PRIu64 " of %s\n", c->id, info->path);
  printf("  triggered %s, %s, %s, %" PRIu64 " instances, record version %"
         PRIu32 " (%" PRIu32 " bytes)\n",
         sl_inspect_time_text(c->trigger_time_ms, time_text, sizeof time_text),
         c->id == info->latest ? "latest (restorable)" : "superseded",
         c->final ? "final (end of input)" : "periodic", c->instance_count,
         c->record_version, c->record_bytes);
  if (c->has_sizes)
    printf("  wrote %" PRIu64 " bytes, %" PRIu64 " keyed-state entries "
           "(puts and deletes)\n", c->bytes_persisted, c->entries_persisted);
  printf("  %s", c->unaligned ? "unaligned" : "aligned");
  if (c->unaligned)
    printf(": %" PRIu64 " bytes of channel state (records in flight)",
           c->channel_bytes);
  printf("\n");
  if (c->id != info->latest) {
    printf("  its blobs and keyed state were replaced by newer checkpoints "
           "(the store keeps the newest only)\n");
    return;
  }
  printf("  keyed state: %" PRIu64 " entries at most, all operators "
         "(%" PRIu64 " compacted + %" PRIu64 " logged changes)\n",
         info->base_entries + info->log_entries, info->base_entries,
         info->log_entries);
  printf("    %-20s %-9s %8s  %10s  %s\n", "operator", "kind", "instance",
         "blob bytes", "state");
  for (int i = 0; i < info->blob_count; i++) {
    const sl_inspect_blob *b = &info->blobs[i];
    char state[200];
    blob_state_text(b, strcmp(operator_kind(in, b), "source") == 0, state,
                    sizeof state);
    printf("    %-20s %-9s %8d  %10" PRIu32 "  %s\n", operator_name(in, b),
           operator_kind(in, b), b->instance, b->bytes, state);
  }
}

static void print_text(const inspection *in, const request *r) {
  if (in->has_manifest)
    print_manifest(&in->manifest, r->dir);
  if (r->has_id) {
    print_detail(in);
    return;
  }
  print_store(in);
  print_list(in);
  print_sources(in);
  print_savepoints(in);
}

/* ------------------------------------------------------------ JSON */

static json_t *operators_json(const sl_inspect_operator *ops, int n) {
  json_t *list = json_array();
  for (int i = 0; i < n; i++)
    json_array_append_new(
        list, json_pack("{s:i, s:s, s:s, s:i}", "id", ops[i].id, "name",
                        ops[i].name, "kind", ops[i].kind, "parallelism",
                        ops[i].parallelism));
  return list;
}

static json_t *checkpoint_json(const inspection *in,
                               const sl_inspect_checkpoint *c) {
  char time_text[40];
  json_t *o = json_pack(
      "{s:I, s:s, s:I, s:s, s:b, s:I, s:i}", "id", (json_int_t)c->id, "time",
      sl_inspect_time_text(c->trigger_time_ms, time_text, sizeof time_text),
      "trigger_time_ms", (json_int_t)c->trigger_time_ms, "status",
      status_of(in, c->id), "final", c->final, "instances",
      (json_int_t)c->instance_count, "record_version", (int)c->record_version);
  if (o && c->has_sizes) {
    json_object_set_new(o, "bytes_persisted",
                        json_integer((json_int_t)c->bytes_persisted));
    json_object_set_new(o, "entries_persisted",
                        json_integer((json_int_t)c->entries_persisted));
  }
  if (o) { /* record version 3 says; older ones were all aligned */
    json_object_set_new(o, "unaligned", json_boolean(c->unaligned));
    json_object_set_new(o, "channel_bytes",
                        json_integer((json_int_t)c->channel_bytes));
  }
  return o;
}

static json_t *blob_json(const inspection *in, const sl_inspect_blob *b) {
  json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:I, s:I, s:I}", "operator",
                        operator_name(in, b), "kind", operator_kind(in, b),
                        "op_id", b->op_id, "instance", b->instance,
                        "checkpoint_id", (json_int_t)b->checkpoint_id,
                        "bytes", (json_int_t)b->bytes, "state_bytes",
                        (json_int_t)b->state_bytes);
  if (b->position_words) {
    json_t *words = json_array();
    for (int w = 0; w < b->position_words; w++)
      json_array_append_new(words, json_integer((json_int_t)b->position[w]));
    json_object_set_new(o, "position", words);
  }
  if (b->has_event_time) {
    json_object_set_new(o, "watermark", json_integer(b->watermark));
    json_object_set_new(o, "max_timestamp", json_integer(b->max_timestamp));
  }
  return o;
}

static json_t *store_json(const inspection *in) {
  const sl_state_dir_info *info = in->info;
  json_t *o = json_pack(
      "{s:s, s:I, s:i, s:I, s:{s:I, s:I}, s:I, s:s, s:i}", "path", info->path,
      "latest", (json_int_t)info->latest, "store_format",
      (int)info->store_format, "data_bytes", (json_int_t)info->data_bytes,
      "keyed_entries", "compacted", (json_int_t)info->base_entries, "logged",
      (json_int_t)info->log_entries, "table_entries",
      (json_int_t)info->table_entries, "graph", info->graph, "max_parallelism",
      (int)info->max_parallelism);
  json_object_set_new(o, "checkpoint_count",
                      json_integer((json_int_t)info->checkpoint_count));
  json_object_set_new(o, "operators",
                      operators_json(info->operators, info->operator_count));
  json_t *list = json_array();
  for (size_t k = 0; k < in->shown; k++)
    json_array_append_new(list, checkpoint_json(in, &in->records[k]));
  json_object_set_new(o, "checkpoints", list);
  json_t *blobs = json_array();
  for (int i = 0; i < info->blob_count; i++)
    json_array_append_new(blobs, blob_json(in, &info->blobs[i]));
  json_object_set_new(o, "blobs", blobs);
  return o;
}

static json_t *savepoints_json(const inspection *in) {
  json_t *list = json_array();
  for (size_t i = 0; i < in->savepoint_count; i++) {
    const sl_savepoint_entry *e = &in->savepoints[i];
    json_array_append_new(
        list, json_pack("{s:I, s:I, s:s, s:I}", "checkpoint_id",
                        (json_int_t)e->checkpoint_id, "created_ms",
                        (json_int_t)e->created_ms, "path", e->path, "bytes",
                        (json_int_t)e->bytes));
  }
  return list;
}

static json_t *manifest_json(const sl_savepoint_manifest *m) {
  json_t *o = json_pack(
      "{s:s, s:i, s:i, s:I, s:I, s:I, s:i, s:s, s:s}", "format", m->format,
      "version", (int)m->version, "store_format", (int)m->store_format,
      "checkpoint_id", (json_int_t)m->checkpoint_id, "created_ms",
      (json_int_t)m->created_ms, "bytes", (json_int_t)m->bytes,
      "max_parallelism", (int)m->max_parallelism, "graph", m->graph,
      "store_dir", m->store_dir);
  json_object_set_new(o, "operators",
                      operators_json(m->operators, m->operator_count));
  return o;
}

static int print_json(const inspection *in, const request *r) {
  json_t *o = store_json(in);
  if (!o)
    return ENOMEM;
  if (in->has_manifest)
    json_object_set_new(o, "savepoint", manifest_json(&in->manifest));
  else
    json_object_set_new(o, "savepoints", savepoints_json(in));
  if (r->has_id) /* the one record asked for, at the top */
    json_object_set_new(o, "checkpoint", checkpoint_json(in, &in->records[0]));
  int rc = json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  printf("\n");
  json_decref(o);
  return rc == 0 ? 0 : EIO;
}

int checkpoints_main(int argc, char **argv) {
  request r = {0};
  parse_request(argc, argv, &r);
  if (r.upgrade)
    return checkpoints_upgrade(r.dir);
  inspection in = {0};
  char err[ERR_BYTES] = "";
  int rc = inspect(&in, &r, err);
  if (rc) {
    inspection_free(&in);
    return error_out(err[0] ? err : sl_strerror(rc));
  }
  if (r.json)
    rc = print_json(&in, &r);
  else
    print_text(&in, &r);
  inspection_free(&in);
  if (rc)
    return error_out("cannot write the JSON output");
  return fflush(stdout) == 0 ? 0 : error_out("cannot write the output");
}
