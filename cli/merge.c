/* merge.c — sort a file sink's committed rows into one file in bounded
 * memory (design notes in merge.h). */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "merge.h"

#define MERGE_FAN_IN 16             /* runs merged into one (note 3) */
#define MERGE_MAX_LEVELS 16         /* run levels (note 4) */
#define MERGE_READ_BUFFER_BYTES ((size_t)64 << 10)
#define MERGE_MAX_PARTS 10000000u   /* part files read; far above real */
#define MERGE_OPEN_RUNS ((MERGE_FAN_IN - 1) * MERGE_MAX_LEVELS + 1)

_Static_assert(MERGE_FAN_IN >= 2, "a merge needs two runs");

size_t merge_run_bytes(void) {
  const char *v = getenv(MERGE_RUN_BYTES_ENV);
  if (!v || !*v)
    return MERGE_DEFAULT_RUN_BYTES;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno || *end || n == 0 || v[0] == '-')
    return MERGE_DEFAULT_RUN_BYTES;
  return (size_t)n;
}

/* ------------------------------------------------------------ rows */

typedef struct row {
  const char *data;
  size_t bytes;
} row;

/* Note 2. */
static int compare_bytes(const char *a, size_t na, const char *b, size_t nb) {
  size_t n = na < nb ? na : nb;
  int c = n ? memcmp(a, b, n) : 0; /* an empty row may have no buffer */
  if (c)
    return c;
  return na < nb ? -1 : na > nb;
}

static int compare_rows(const void *a, const void *b) {
  const row *x = a, *y = b;
  return compare_bytes(x->data, x->bytes, y->data, y->bytes);
}

/* A growable byte buffer. */
typedef struct bytes {
  char *data;
  size_t used, capacity;
} bytes;

static int bytes_reserve(bytes *b, size_t more) {
  if (b->used + more <= b->capacity)
    return 0;
  size_t c = b->capacity ? b->capacity : 256;
  while (c < b->used + more)
    c *= 2;
  char *d = realloc(b->data, c);
  if (!d)
    return ENOMEM;
  b->data = d, b->capacity = c;
  return 0;
}

/* Note 1: the next row of f into out (without its newline).  Returns 1 a
 * row, 0 the end of the file, EINVAL a quoted field open at the end, or an
 * errno value.  chunk is getdelim's buffer. */
static int next_csv_row(FILE *f, char **chunk, size_t *chunk_bytes,
                        bytes *out) {
  out->used = 0;
  bool quoted = false, any = false;
  for (;;) {
    ssize_t n = getdelim(chunk, chunk_bytes, '\n', f);
    if (n < 0) {
      if (ferror(f))
        return errno ? errno : EIO;
      if (quoted)
        return EINVAL;
      return any ? 1 : 0;
    }
    any = true;
    for (ssize_t i = 0; i < n; i++)
      quoted ^= (*chunk)[i] == '"';
    bool ends = (*chunk)[n - 1] == '\n';
    size_t keep = (size_t)n - (ends && !quoted);
    if (bytes_reserve(out, keep))
      return ENOMEM;
    if (keep)
      memcpy(out->data + out->used, *chunk, keep);
    out->used += keep;
    if (ends && !quoted)
      return 1;
  }
}

/* ------------------------------------------------------------ runs */

/* A sorted run in a temporary file: rows framed by a size_t length. */
typedef struct run_file {
  FILE *file;
} run_file;

/* Reads one run back, a row at a time. */
typedef struct run_reader {
  FILE *file;
  bytes current;
  bool done;
} run_reader;

/* Where merged rows go: a new run (framed) or the output (a newline after
 * each row). */
typedef struct row_writer {
  FILE *file;
  bool framed;
  uint64_t rows;
} row_writer;

typedef struct merger {
  const char *path; /* the output; temporaries are named after it */
  size_t run_bytes;
  bytes data;  /* row bytes of the buffer */
  row *rows;   /* the buffer's rows */
  size_t count, row_capacity;
  run_file runs[MERGE_MAX_LEVELS][MERGE_FAN_IN];
  int run_count[MERGE_MAX_LEVELS];
  char *err;
  size_t err_bytes;
} merger;

static int put_row(row_writer *w, const char *data, size_t n) {
  if (w->framed && fwrite(&n, sizeof n, 1, w->file) != 1)
    return errno ? errno : EIO;
  if (n && fwrite(data, 1, n, w->file) != n)
    return errno ? errno : EIO;
  if (!w->framed && fputc('\n', w->file) == EOF)
    return errno ? errno : EIO;
  w->rows++;
  return 0;
}

static int reader_next(run_reader *r) {
  size_t n;
  if (fread(&n, sizeof n, 1, r->file) != 1) {
    r->done = true;
    return ferror(r->file) ? EIO : 0;
  }
  r->current.used = 0;
  if (bytes_reserve(&r->current, n))
    return ENOMEM;
  if (n && fread(r->current.data, 1, n, r->file) != n)
    return EIO; /* our own file, cut short: the disk lost it */
  r->current.used = n;
  return 0;
}

/* A temporary file beside the output, unlinked at once (note 3). */
static int temp_file(merger *m, FILE **out) {
  char name[8300];
  snprintf(name, sizeof name, "%s.sort-XXXXXX", m->path);
  int fd = mkstemp(name);
  if (fd < 0) {
    snprintf(m->err, m->err_bytes, "cannot create a temporary file %s: %s",
             name, strerror(errno));
    return errno;
  }
  unlink(name);
  *out = fdopen(fd, "w+b");
  if (!*out) {
    int e = errno;
    close(fd);
    return e;
  }
  return 0;
}

/* Min-heap of readers by current row. */
static bool reader_less(const run_reader *a, const run_reader *b) {
  return compare_bytes(a->current.data, a->current.used, b->current.data,
                       b->current.used) < 0;
}

static void sift_down(run_reader **heap, int n, int i) {
  for (;;) { /* bounded: i at least doubles each turn */
    int l = 2 * i + 1, r = l + 1, low = i;
    if (l < n && reader_less(heap[l], heap[low]))
      low = l;
    if (r < n && reader_less(heap[r], heap[low]))
      low = r;
    if (low == i)
      return;
    run_reader *t = heap[i];
    heap[i] = heap[low], heap[low] = t;
    i = low;
  }
}

/* Merge runs (rewound) into w with a heap; closes the runs. */
static int merge_runs(run_file *runs, int n, row_writer *w) {
  assert(n >= 1 && n <= MERGE_OPEN_RUNS);
  run_reader readers[MERGE_OPEN_RUNS];
  run_reader *heap[MERGE_OPEN_RUNS];
  int live = 0, rc = 0;
  for (int i = 0; i < n; i++) {
    readers[i] = (run_reader){.file = runs[i].file};
    setvbuf(runs[i].file, NULL, _IOFBF, MERGE_READ_BUFFER_BYTES);
    if (rc == 0 && fseek(runs[i].file, 0, SEEK_SET) != 0)
      rc = errno;
    if (rc == 0)
      rc = reader_next(&readers[i]);
    if (rc == 0 && !readers[i].done)
      heap[live++] = &readers[i];
  }
  for (int i = live / 2 - 1; i >= 0; i--)
    sift_down(heap, live, i);
  while (rc == 0 && live > 0) {
    run_reader *top = heap[0];
    rc = put_row(w, top->current.data, top->current.used);
    if (rc == 0)
      rc = reader_next(top);
    if (rc == 0 && top->done)
      heap[0] = heap[--live];
    sift_down(heap, live, 0);
  }
  for (int i = 0; i < n; i++) {
    fclose(runs[i].file);
    free(readers[i].current.data);
  }
  return rc;
}

static int add_run(merger *m, int level, FILE *file);

/* A sorted run just written to file, rc the writing's result: flushed and
 * added at level, or, on an error, closed with "WHAT for PATH: cause" in
 * the merger's message. */
static int keep_run(merger *m, int level, FILE *file, int rc,
                    const char *what) {
  if (rc == 0 && fflush(file) != 0)
    rc = errno ? errno : EIO;
  if (rc) {
    fclose(file);
    snprintf(m->err, m->err_bytes, "%s for %s: %s", what, m->path,
             strerror(rc));
    return rc;
  }
  return add_run(m, level, file);
}

/* Note 3: MERGE_FAN_IN runs of level become one of level + 1 (the
 * recursion through keep_run is bounded by MERGE_MAX_LEVELS). */
static int add_run(merger *m, int level, FILE *file) {
  if (level >= MERGE_MAX_LEVELS) {
    fclose(file);
    snprintf(m->err, m->err_bytes, "writing %s: more than %d merge levels",
             m->path, MERGE_MAX_LEVELS);
    return EFBIG;
  }
  m->runs[level][m->run_count[level]++].file = file;
  if (m->run_count[level] < MERGE_FAN_IN)
    return 0;
  FILE *merged;
  int rc = temp_file(m, &merged);
  if (rc)
    return rc;
  row_writer w = {.file = merged, .framed = true};
  rc = merge_runs(m->runs[level], MERGE_FAN_IN, &w);
  m->run_count[level] = 0;
  return keep_run(m, level + 1, merged, rc, "merging sorted runs");
}

/* Sort the buffer and write it to w; empty it. */
static int drain_buffer(merger *m, row_writer *w) {
  if (m->count)
    qsort(m->rows, m->count, sizeof *m->rows, compare_rows);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < m->count; i++)
    rc = put_row(w, m->rows[i].data, m->rows[i].bytes);
  m->count = 0;
  m->data.used = 0;
  return rc;
}

static int spill(merger *m) {
  FILE *file;
  int rc = temp_file(m, &file);
  if (rc)
    return rc;
  setvbuf(file, NULL, _IOFBF, MERGE_READ_BUFFER_BYTES);
  row_writer w = {.file = file, .framed = true};
  rc = drain_buffer(m, &w);
  return keep_run(m, 0, file, rc, "writing a sorted run");
}

/* Add one row to the buffer, spilling it first when the row would not fit
 * (note 3: row bytes plus the index entry count against run_bytes). */
static int add_row(merger *m, const char *data, size_t n) {
  size_t budget = m->data.used + n + (m->count + 1) * sizeof(row);
  if (m->count &&
      (budget > m->run_bytes || m->data.used + n > m->data.capacity)) {
    int rc = spill(m);
    if (rc)
      return rc;
  }
  if (m->count == 0 && (n > m->data.capacity || !m->data.data)) {
    /* Rows point into data: it may move only while it holds none.  It
     * has run_bytes, or the one row that is longer (note 4). */
    size_t c = n > m->run_bytes ? n : m->run_bytes;
    char *d = realloc(m->data.data, c ? c : 1);
    if (!d)
      return ENOMEM;
    m->data.data = d, m->data.capacity = c;
  }
  assert(m->data.used + n <= m->data.capacity);
  if (m->count == m->row_capacity) {
    size_t c = m->row_capacity ? m->row_capacity * 2 : 1024;
    row *r = realloc(m->rows, c * sizeof *r);
    if (!r)
      return ENOMEM;
    m->rows = r, m->row_capacity = c;
  }
  if (n)
    memcpy(m->data.data + m->data.used, data, n);
  m->rows[m->count++] = (row){m->data.data + m->data.used, n};
  m->data.used += n;
  return 0;
}

/* ------------------------------------------------------------ parts */

/* Add the rows of the part at path, without its header (note 1). */
static int read_part(merger *m, const char *path, const char *header) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(m->err, m->err_bytes, "cannot read %s: %s", path,
             strerror(errno));
    return errno;
  }
  setvbuf(f, NULL, _IOFBF, MERGE_READ_BUFFER_BYTES);
  char *chunk = NULL;
  size_t chunk_bytes = 0, header_bytes = strlen(header);
  bytes r = {0};
  int rc;
  for (bool first = true; (rc = next_csv_row(f, &chunk, &chunk_bytes, &r)) == 1;
       first = false) {
    if (first && compare_bytes(r.data, r.used, header, header_bytes) == 0)
      continue;
    if ((rc = add_row(m, r.data, r.used)) != 0)
      break;
  }
  if (rc == EINVAL)
    snprintf(m->err, m->err_bytes, "%s: the file ends inside a quoted field",
             path);
  else if (rc && !m->err[0])
    snprintf(m->err, m->err_bytes, "reading %s: %s", path, strerror(rc));
  free(chunk);
  free(r.data);
  fclose(f);
  return rc;
}

static int compare_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every committed part name of dir (part-*), sorted; a missing dir has
 * none. */
static int list_parts(const char *dir, char ***names, size_t *count) {
  *names = NULL, *count = 0;
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : errno;
  size_t cap = 0;
  int rc = 0;
  for (struct dirent *e; rc == 0 && *count < MERGE_MAX_PARTS &&
                         (e = readdir(d));) {
    if (strncmp(e->d_name, "part-", 5) != 0)
      continue;
    if (*count == cap) {
      cap = cap ? cap * 2 : 64;
      char **n = realloc(*names, cap * sizeof *n);
      if (!n) {
        rc = ENOMEM;
        break;
      }
      *names = n;
    }
    if (!((*names)[*count] = strdup(e->d_name)))
      rc = ENOMEM;
    else
      (*count)++;
  }
  closedir(d);
  if (*count)
    qsort(*names, *count, sizeof **names, compare_names);
  return rc;
}

/* ------------------------------------------------------------ output */

/* Every run left and the buffer, merged into w (note 3). */
static int finish_rows(merger *m, row_writer *w) {
  int runs = 0;
  for (int l = 0; l < MERGE_MAX_LEVELS; l++)
    runs += m->run_count[l];
  if (runs == 0)
    return drain_buffer(m, w); /* everything fit: sort in memory */
  int rc = m->count ? spill(m) : 0;
  if (rc)
    return rc;
  run_file all[MERGE_OPEN_RUNS];
  int n = 0;
  for (int l = 0; l < MERGE_MAX_LEVELS; l++) {
    for (int i = 0; i < m->run_count[l]; i++)
      all[n++] = m->runs[l][i];
    m->run_count[l] = 0;
  }
  return merge_runs(all, n, w);
}

static int write_output(merger *m, const char *header, uint64_t *rows) {
  char tmp[8300];
  snprintf(tmp, sizeof tmp, "%s.tmp", m->path);
  FILE *f = fopen(tmp, "wb");
  if (!f) {
    snprintf(m->err, m->err_bytes, "cannot create %s: %s", tmp,
             strerror(errno));
    return errno;
  }
  setvbuf(f, NULL, _IOFBF, MERGE_READ_BUFFER_BYTES);
  row_writer w = {.file = f};
  int rc = fprintf(f, "%s\n", header) < 0 ? (errno ? errno : EIO) : 0;
  if (rc == 0)
    rc = finish_rows(m, &w);
  if (rc == 0 && (fflush(f) != 0 || fsync(fileno(f)) != 0))
    rc = errno ? errno : EIO;
  if (fclose(f) != 0 && rc == 0)
    rc = errno;
  if (rc == 0 && rename(tmp, m->path) != 0)
    rc = errno;
  if (rc && !m->err[0])
    snprintf(m->err, m->err_bytes, "writing %s: %s", tmp, strerror(rc));
  *rows = w.rows;
  return rc;
}

static void free_merger(merger *m) {
  for (int l = 0; l < MERGE_MAX_LEVELS; l++)
    for (int i = 0; i < m->run_count[l]; i++)
      fclose(m->runs[l][i].file);
  free(m->data.data);
  free(m->rows);
}

int merge_parts(const char *dir, const char *path, const char *header,
                size_t run_bytes, uint64_t *rows, char *err,
                size_t err_bytes) {
  assert(err && err_bytes > 0);
  err[0] = 0;
  *rows = 0;
  merger m = {.path = path, .run_bytes = run_bytes ? run_bytes : 1,
              .err = err, .err_bytes = err_bytes};
  char **names;
  size_t count;
  int rc = list_parts(dir, &names, &count);
  if (rc)
    snprintf(err, err_bytes, "cannot read directory %s: %s", dir,
             strerror(rc));
  char file[8300];
  for (size_t i = 0; rc == 0 && i < count; i++) {
    snprintf(file, sizeof file, "%s/%s", dir, names[i]);
    rc = read_part(&m, file, header);
  }
  for (size_t i = 0; i < count; i++)
    free(names[i]);
  free(names);
  if (rc == 0)
    rc = write_output(&m, header, rows);
  free_merger(&m);
  return rc;
}
