/* inspect_savepoint.c — reading the files the savepoint code writes
 * (inspect.h): the savepoints.jsonl index of a state directory and the
 * manifest.json of a savepoint.  Reading only; a malformed file is
 * reported with its path, its line (for the index) and the field at
 * fault, and nothing is guessed. */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "inspect.h"
#include "inspect_internal.h"

/* Lines of savepoints.jsonl read at most: a savepoint is a manual act, so
 * even a busy index stays far below; a bigger file is not ours. */
#define INDEX_MAX_LINES 1000000u
/* Subdirectories of a savepoint searched for its data.mdb. */
#define SAVEPOINT_MAX_ENTRIES 64
#define MANIFEST_FORMAT "sluice-savepoint"

/* A whole number >= 0 field of o, or NULL and *why. */
static bool get_u64(const json_t *o, const char *field, uint64_t *out,
                    const char **why) {
  json_t *v = json_object_get(o, field);
  if (!v) {
    *why = "is missing";
    return false;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    *why = "is not a whole number >= 0";
    return false;
  }
  *out = (uint64_t)json_integer_value(v);
  return true;
}

/* One line of the index into *e; EINVAL with the reason. */
static int parse_index_line(const char *path, size_t line_no, const char *line,
                            size_t len, sl_savepoint_entry *e, char *err,
                            size_t err_bytes) {
  json_error_t jerr;
  json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!o)
    return sl_inspect_fail(err, err_bytes, EINVAL, "%s:%zu: not JSON: %s", path,
                           line_no, jerr.text);
  const char *why = 0, *field = 0;
  uint64_t created = 0;
  if (!json_is_object(o))
    field = "the line", why = "is not a JSON object";
  else if (!get_u64(o, field = "checkpoint_id", &e->checkpoint_id, &why) ||
           !get_u64(o, field = "created_ms", &created, &why) ||
           !get_u64(o, field = "bytes", &e->bytes, &why))
    ;
  else if (e->checkpoint_id == 0)
    why = "is 0, not a checkpoint";
  else {
    json_t *p = json_object_get(o, field = "path");
    const char *text = json_string_value(p);
    if (!p)
      why = "is missing";
    else if (!text || !text[0])
      why = "is not a non-empty string";
    else if (strlen(text) >= sizeof e->path)
      why = "is too long";
    else
      strcpy(e->path, text);
  }
  e->created_ms = (int64_t)created;
  json_decref(o);
  if (why)
    return sl_inspect_fail(err, err_bytes, EINVAL, "%s:%zu: \"%s\" %s", path,
                           line_no, field, why);
  return 0;
}

static int index_add(sl_savepoint_entry **entries, size_t *count,
                     size_t *capacity) {
  if (*count < *capacity)
    return 0;
  size_t more = *capacity ? 2 * *capacity : 8;
  sl_savepoint_entry *grown = realloc(*entries, more * sizeof *grown);
  if (!grown)
    return ENOMEM;
  *entries = grown;
  *capacity = more;
  return 0;
}

/* The lines of f, one entry each (blank lines skipped). */
static int read_index(FILE *f, const char *path, sl_savepoint_entry **entries,
                      size_t *count, char *err, size_t err_bytes) {
  char *line = 0;
  size_t line_capacity = 0, capacity = 0;
  int rc = 0;
  for (size_t line_no = 1; rc == 0 && line_no <= INDEX_MAX_LINES; line_no++) {
    errno = 0;
    ssize_t got = getline(&line, &line_capacity, f);
    if (got < 0) {
      if (errno != 0)
        rc = sl_inspect_fail(err, err_bytes, errno, "%s: %s", path,
                             strerror(errno));
      break;
    }
    size_t len = (size_t)got;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      len--;
    if (strspn(line, " \t") >= len)
      continue; /* blank */
    rc = index_add(entries, count, &capacity);
    if (rc == 0) {
      memset(&(*entries)[*count], 0, sizeof **entries);
      rc = parse_index_line(path, line_no, line, len, &(*entries)[*count],
                            err, err_bytes);
    }
    if (rc == 0)
      (*count)++;
    else if (rc == ENOMEM)
      sl_inspect_fail(err, err_bytes, rc, "%s: out of memory", path);
  }
  free(line);
  return rc;
}

int sl_savepoints_read(const char *state_dir, sl_savepoint_entry **entries,
                       size_t *count, char *err, size_t err_bytes) {
  assert(entries && count);
  *entries = 0;
  *count = 0;
  char path[SL_SAVEPOINT_PATH_BYTES];
  if (snprintf(path, sizeof path, "%s/savepoints.jsonl", state_dir) >=
      (int)sizeof path)
    return sl_inspect_fail(err, err_bytes, ENAMETOOLONG, "%s: path too long",
                           state_dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return sl_inspect_fail(err, err_bytes, errno, "%s: %s", path,
                           strerror(errno));
  int rc = read_index(f, path, entries, count, err, err_bytes);
  fclose(f);
  if (rc != 0) {
    free(*entries);
    *entries = 0;
    *count = 0;
  }
  return rc;
}

/* ------------------------------------------------------------ manifest */

int sl_savepoint_is_dir(const char *dir) {
  char path[SL_SAVEPOINT_PATH_BYTES];
  struct stat st;
  return snprintf(path, sizeof path, "%s/manifest.json", dir) <
             (int)sizeof path &&
         stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static bool has_data_file(const char *dir) {
  char path[SL_SAVEPOINT_PATH_BYTES + 16];
  struct stat st;
  int n = snprintf(path, sizeof path, "%s/data.mdb", dir);
  return n > 0 && (size_t)n < sizeof path && stat(path, &st) == 0 &&
         S_ISREG(st.st_mode);
}

/* Where the savepoint's store is: dir itself, or one subdirectory of it
 * (the first in name order) holding data.mdb. */
static void find_store(const char *dir, char *out, size_t out_bytes) {
  out[0] = 0;
  if (has_data_file(dir)) {
    snprintf(out, out_bytes, "%s", dir);
    return;
  }
  DIR *d = opendir(dir);
  if (!d)
    return;
  char best[256] = "";
  struct dirent *e;
  for (int n = 0; n < SAVEPOINT_MAX_ENTRIES && (e = readdir(d)); n++) {
    char sub[SL_SAVEPOINT_PATH_BYTES];
    if (e->d_name[0] == '.')
      continue;
    int len = snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    if (len > 0 && (size_t)len < sizeof sub && has_data_file(sub) &&
        (!best[0] || strcmp(e->d_name, best) < 0))
      snprintf(best, sizeof best, "%s", e->d_name);
  }
  closedir(d);
  if (best[0]) {
    int len = snprintf(out, out_bytes, "%s/%s", dir, best);
    if (len < 0 || (size_t)len >= out_bytes)
      out[0] = 0; /* too long to name */
  }
}

/* The operators array of the manifest; the name of the bad field. */
static const char *manifest_operators(const json_t *list,
                                      sl_savepoint_manifest *m,
                                      const char **why) {
  if (!json_is_array(list) || json_array_size(list) > SL_MAX_OPERATORS) {
    *why = "is missing or not an array of at most 1024 operators";
    return "operators";
  }
  size_t n = json_array_size(list);
  m->operators = calloc(n + 1, sizeof *m->operators);
  if (!m->operators) {
    *why = "cannot be read: out of memory";
    return "operators";
  }
  for (size_t i = 0; i < n; i++) {
    const json_t *o = json_array_get(list, i);
    sl_inspect_operator *op = &m->operators[i];
    const char *name = json_string_value(json_object_get(o, "name"));
    const char *kind = json_string_value(json_object_get(o, "kind"));
    json_t *id = json_object_get(o, "id");
    json_t *p = json_object_get(o, "parallelism");
    if (!name || strlen(name) >= sizeof op->name || !kind ||
        strlen(kind) >= sizeof op->kind || !json_is_integer(id) ||
        json_integer_value(id) < 0 || !json_is_integer(p) ||
        json_integer_value(p) < 1) {
      *why = "has an entry without a whole id, name, kind or parallelism";
      return "operators";
    }
    strcpy(op->name, name);
    strcpy(op->kind, kind);
    op->id = (int)json_integer_value(id);
    op->parallelism = (int)json_integer_value(p);
    m->operator_count = (int)i + 1;
  }
  return 0;
}

/* The fields of a parsed manifest; the name of the first bad one. */
static const char *manifest_fields(const json_t *o, sl_savepoint_manifest *m,
                                   const char **why) {
  *why = "is missing or of the wrong type";
  const char *format = json_string_value(json_object_get(o, "format"));
  if (!format)
    return "format";
  snprintf(m->format, sizeof m->format, "%s", format);
  if (strcmp(format, MANIFEST_FORMAT) != 0) {
    *why = "is not \"" MANIFEST_FORMAT "\"";
    return "format";
  }
  uint64_t v = 0, created = 0, store_format = 0, max_p = 0;
  if (!get_u64(o, "version", &v, why))
    return "version";
  if (!get_u64(o, "store_format", &store_format, why))
    return "store_format";
  if (!get_u64(o, "checkpoint_id", &m->checkpoint_id, why))
    return "checkpoint_id";
  if (!get_u64(o, "created_ms", &created, why))
    return "created_ms";
  if (!get_u64(o, "bytes", &m->bytes, why))
    return "bytes";
  if (!get_u64(o, "max_parallelism", &max_p, why))
    return "max_parallelism";
  const char *graph = json_string_value(json_object_get(o, "graph"));
  *why = "is missing or of the wrong type";
  if (!graph)
    return "graph";
  m->version = (uint32_t)v;
  m->store_format = (uint32_t)store_format;
  m->created_ms = (int64_t)created;
  m->max_parallelism = (uint32_t)max_p;
  if (!(m->graph = strdup(graph))) {
    *why = "cannot be read: out of memory";
    return "graph";
  }
  return manifest_operators(json_object_get(o, "operators"), m, why);
}

int sl_savepoint_manifest_read(const char *dir, sl_savepoint_manifest *m,
                               char *err, size_t err_bytes) {
  assert(dir && m);
  memset(m, 0, sizeof *m);
  char path[SL_SAVEPOINT_PATH_BYTES];
  if (snprintf(path, sizeof path, "%s/manifest.json", dir) >= (int)sizeof path)
    return sl_inspect_fail(err, err_bytes, ENAMETOOLONG, "%s: path too long",
                           dir);
  FILE *f = fopen(path, "r");
  if (!f)
    return sl_inspect_fail(err, err_bytes, errno, "%s: %s", path,
                           strerror(errno));
  json_error_t jerr;
  json_t *o = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
  fclose(f);
  if (!o)
    return sl_inspect_fail(err, err_bytes, EINVAL, "%s: line %d: not JSON: %s",
                           path, jerr.line, jerr.text);
  const char *why = "";
  const char *bad = json_is_object(o) ? manifest_fields(o, m, &why)
                                      : "the file (not a JSON object)";
  json_decref(o);
  if (bad)
    return sl_inspect_fail(err, err_bytes, EINVAL, "%s: \"%s\" %s", path, bad,
                           why);
  find_store(dir, m->store_dir, sizeof m->store_dir);
  return 0;
}

void sl_savepoint_manifest_free(sl_savepoint_manifest *m) {
  if (!m)
    return;
  free(m->graph);
  free(m->operators);
  m->graph = 0;
  m->operators = 0;
  m->operator_count = 0;
}
