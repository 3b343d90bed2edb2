/* inspect.c — a state directory read from outside its job (inspect.h).
 *
 * NOTES
 *
 * 1. The store is opened read-only: no lock file is taken and only read
 *    transactions run, so a job writing the directory is never blocked
 *    (LMDB readers do not block its writer) and nothing is changed.
 * 2. The graph fingerprint, the counts and every blob are read in one read
 *    transaction (sl_store_read_view), so they describe one checkpoint,
 *    "latest"; the checkpoint ids are listed afterwards and those above
 *    latest (committed meanwhile) are left out, so the listing agrees
 *    with the blobs.  Each one left out is read first: a committed record
 *    reads back whole, where one a damaged key put above latest fails its
 *    checksum (which covers the key) and the open fails SL_ECORRUPT; left
 *    out unread, such damage went unreported (corrupt::random_byte_flips
 *    found one).
 * 3. The layouts decoded here are written elsewhere: the record by
 *    checkpoint_writer.c (write_once: u32 version, u32 final, i64 trigger time
 *    in ms, u64 instance count, 24 bytes, little-endian; version 2 adds
 *    u64 bytes and u64 entries persisted, 40 bytes), the blob by
 *    checkpoint_writer.c (write_instance: a flag byte, bit 0 operator state
 *    follows, bit 1 a 16-byte event-time trailer of i64 watermark and i64
 *    largest timestamp, bit 3 channel state: a u64 length and that many
 *    bytes right after the flag byte), the fingerprint by graph.c
 *    (sl_graph_fingerprint: "max_parallelism=M" then ";ID:KIND:NAME:P" per
 *    physical operator).  Bytes that do not fit are reported as corrupt
 *    (records, blobs) or shown raw (a fingerprint whose names hold ';').
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "inspect.h"
#include "inspect_internal.h"
#include "store.h"

#define RECORD_V1_BYTES 24u
#define RECORD_V2_BYTES 40u
#define RECORD_V3_BYTES 56u /* unaligned: channel state */
#define BLOB_FLAG_STATE 1u
#define BLOB_FLAG_EVENT_TIME 2u
#define BLOB_FLAG_FINISHED 4u /* coordinator.c note 10; nothing follows */
#define BLOB_FLAG_CHANNELS 8u /* checkpoint_writer.c note 6 */
#define BLOB_EVENT_TIME_BYTES 16u

struct sl_state_dir {
  sl_store *store;
  sl_state_dir_info info;
  char *path;
  char *graph;
  sl_inspect_operator *operators;
  sl_inspect_blob *blobs;
  int blob_capacity;
  uint64_t *ids;
};

/* See inspect_internal.h. */
int sl_inspect_fail(char *err, size_t err_bytes, int rc, const char *fmt, ...) {
  if (err && err_bytes > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_bytes, fmt, ap);
    va_end(ap);
  }
  return rc;
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

/* ------------------------------------------------------------ graph */

/* One ";ID:KIND:NAME:P" part (without the ';', len bytes) into *op. */
static bool parse_operator(const char *part, size_t len,
                           sl_inspect_operator *op) {
  const char *end = part + len;
  const char *c1 = memchr(part, ':', len);
  const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : 0;
  const char *c3 = end;
  while (c3 > part && c3[-1] != ':') /* the last ':' ends the name */
    c3--;
  if (!c1 || !c2 || c3 <= c2 + 1)
    return false;
  size_t kind_len = (size_t)(c2 - c1 - 1);
  size_t name_len = (size_t)(c3 - 1 - c2 - 1);
  if (kind_len == 0 || kind_len >= sizeof op->kind || name_len == 0 ||
      name_len >= sizeof op->name)
    return false;
  char *num_end;
  long id = strtol(part, &num_end, 10);
  if (num_end != c1 || id < 0 || id > UINT16_MAX)
    return false;
  long p = strtol(c3, &num_end, 10);
  if (num_end != end || p < 1 || p > SL_MAX_PARALLELISM)
    return false;
  op->id = (int)id;
  op->parallelism = (int)p;
  memcpy(op->kind, c1 + 1, kind_len);
  op->kind[kind_len] = 0;
  memcpy(op->name, c2 + 1, name_len);
  op->name[name_len] = 0;
  return true;
}

/* The fingerprint into max_parallelism and operators (note 3); on a text
 * it cannot read, both stay 0 and the caller shows the raw text. */
static int parse_graph(sl_state_dir *sd) {
  const char *g = sd->graph;
  unsigned long m = 0;
  int consumed = 0;
  if (sscanf(g, "max_parallelism=%lu%n", &m, &consumed) != 1 || m == 0 ||
      m > 32768)
    return 0;
  int parts = 0;
  for (const char *c = g; *c; c++)
    parts += *c == ';';
  sd->operators = calloc((size_t)parts + 1, sizeof *sd->operators);
  if (!sd->operators)
    return ENOMEM;
  const char *at = g + consumed;
  int n = 0;
  while (*at == ';' && n < parts) { /* one part per ';' */
    const char *next = strchr(at + 1, ';');
    size_t len = next ? (size_t)(next - at - 1) : strlen(at + 1);
    if (!parse_operator(at + 1, len, &sd->operators[n]))
      return 0; /* unreadable: info keeps operator_count 0 */
    n++;
    at += 1 + len;
  }
  if (*at != 0)
    return 0;
  sd->info.max_parallelism = (uint32_t)m;
  sd->info.operator_count = n;
  sd->info.operators = sd->operators;
  return 0;
}

/* ------------------------------------------------------------ blobs */

static int operator_index(const sl_state_dir *sd, int op_id) {
  for (int i = 0; i < sd->info.operator_count; i++)
    if (sd->operators[i].id == op_id)
      return i;
  return -1;
}

/* Decodes one blob (note 3); SL_ECORRUPT for bytes that do not fit. */
static int decode_blob(const uint8_t *data, uint32_t bytes,
                       sl_inspect_blob *b) {
  if (bytes < 1 || data[0] > (BLOB_FLAG_STATE | BLOB_FLAG_EVENT_TIME |
                              BLOB_FLAG_FINISHED | BLOB_FLAG_CHANNELS))
    return SL_ECORRUPT;
  uint32_t trailer = (data[0] & BLOB_FLAG_EVENT_TIME) ? BLOB_EVENT_TIME_BYTES
                                                      : 0;
  if (bytes < 1 + trailer)
    return SL_ECORRUPT;
  /* The channel state (an unaligned checkpoint): a u64 length after the
   * flag byte, then that many bytes; only its size is shown. */
  uint32_t head = 1;
  if (data[0] & BLOB_FLAG_CHANNELS) {
    if (bytes < 9 + trailer)
      return SL_ECORRUPT;
    uint64_t section = le64(data + 1);
    if (section > bytes - 9 - trailer)
      return SL_ECORRUPT;
    b->channel_bytes = section;
    head = 9 + (uint32_t)section;
  }
  b->bytes = bytes;
  b->has_state = (data[0] & BLOB_FLAG_STATE) != 0;
  b->state_bytes = b->has_state ? bytes - head - trailer : 0;
  if (!b->has_state && bytes != head + trailer)
    return SL_ECORRUPT;
  if (b->state_bytes >= 8 && b->state_bytes % 8 == 0 &&
      b->state_bytes <= 8 * SL_INSPECT_POSITION_WORDS) {
    b->position_words = (int)(b->state_bytes / 8);
    for (int w = 0; w < b->position_words; w++)
      b->position[w] = le64(data + head + 8 * w);
  }
  if (trailer) {
    b->has_event_time = 1;
    b->watermark = (int64_t)le64(data + bytes - 16);
    b->max_timestamp = (int64_t)le64(data + bytes - 8);
  }
  return 0;
}

typedef struct blob_walk {
  sl_state_dir *sd;
  char *err;
  size_t err_bytes;
} blob_walk;

static int add_blob(void *arg, uint16_t op, uint16_t instance,
                    uint64_t checkpoint_id, const void *data, uint32_t bytes) {
  blob_walk *w = arg;
  sl_state_dir *sd = w->sd;
  if (sd->info.blob_count == sd->blob_capacity) {
    int capacity = sd->blob_capacity ? 2 * sd->blob_capacity : 16;
    sl_inspect_blob *more = realloc(sd->blobs, (size_t)capacity * sizeof *more);
    if (!more)
      return ENOMEM;
    sd->blobs = more;
    sd->blob_capacity = capacity;
  }
  sl_inspect_blob *b = &sd->blobs[sd->info.blob_count];
  memset(b, 0, sizeof *b);
  b->op_id = op;
  b->instance = instance;
  b->checkpoint_id = checkpoint_id;
  b->operator_index = operator_index(sd, op);
  if (decode_blob(data, bytes, b) != 0)
    return sl_inspect_fail(w->err, w->err_bytes, SL_ECORRUPT,
                           "%s: the blob of operator %u instance %u (%" PRIu32
                           " bytes, flags 0x%02x) is not one this sluice wrote",
                           sd->path, op, instance, bytes,
                           bytes ? ((const uint8_t *)data)[0] : 0u);
  sd->info.blob_count++;
  return 0;
}

/* ------------------------------------------------------------ open */

static int read_contents(sl_state_dir *sd, char *err, size_t err_bytes) {
  sl_store_view view;
  blob_walk walk = {.sd = sd, .err = err, .err_bytes = err_bytes};
  if (err && err_bytes)
    err[0] = 0;
  int rc = sl_store_read_view(sd->store, &view, add_blob, &walk);
  if (rc != 0) /* add_blob's own message, else the store's */
    return err && err_bytes && err[0] ? rc
           : sl_store_error(sd->store)[0] /* it names the directory */
               ? sl_inspect_fail(err, err_bytes, rc, "%s",
                                 sl_store_error(sd->store))
               : sl_inspect_fail(err, err_bytes, rc, "%s: %s", sd->path,
                                 sl_strerror(rc));
  sd->graph = view.graph;
  sd->info.graph = view.graph;
  sd->info.latest = view.latest;
  sd->info.store_format = view.format;
  sd->info.log_entries = view.log_entries;
  sd->info.base_entries = view.base_entries;
  sd->info.table_entries = view.table_entries;
  rc = parse_graph(sd);
  for (int i = 0; rc == 0 && i < sd->info.blob_count; i++) /* graph now read */
    sd->blobs[i].operator_index = operator_index(sd, sd->blobs[i].op_id);
  sd->info.blobs = sd->blobs;
  size_t count = 0;
  if (rc == 0)
    rc = sl_store_list_checkpoints(sd->store, &sd->ids, &count);
  if (rc != 0)
    return sl_inspect_fail(
        err, err_bytes, rc, "%s: listing checkpoints: %s", sd->path,
        rc == ENOMEM ? sl_strerror(rc) : sl_store_error(sd->store));
  /* Note 2: ids above latest were committed since the view was read, so
   * their records read back whole; one that does not (a damaged key lands
   * a record there, and its checksum, which covers the key, fails) is
   * corruption, not a newer checkpoint to leave out silently. */
  for (; count > 0 && sd->ids[count - 1] > view.latest; count--) {
    void *record = 0;
    uint32_t bytes = 0;
    rc = sl_store_get_checkpoint(sd->store, sd->ids[count - 1], &record,
                                 &bytes);
    free(record);
    if (rc != 0)
      return sl_inspect_fail(err, err_bytes, rc, "%s",
                             sl_store_error(sd->store));
  }
  sd->info.checkpoint_ids = sd->ids;
  sd->info.checkpoint_count = count;
  return 0;
}

int sl_state_dir_open(const char *dir, unsigned flags, sl_state_dir **out,
                      char *err, size_t err_bytes) {
  if (!out || !dir || (flags & ~SL_STATE_DIR_NO_LOCK_FILE) != 0)
    return sl_inspect_fail(err, err_bytes, EINVAL,
                           "sl_state_dir_open: NULL argument or unknown flag");
  *out = 0;
  sl_state_dir *sd = calloc(1, sizeof *sd);
  if (!sd || !(sd->path = strdup(dir))) {
    free(sd);
    return sl_inspect_fail(err, err_bytes, ENOMEM, "%s: out of memory", dir);
  }
  sd->info.path = sd->path;
  sl_store_options options = {
      .read_only = 1,
      .no_lock_file = (flags & SL_STATE_DIR_NO_LOCK_FILE) != 0};
  int rc = sl_store_open(dir, &options, &sd->store, err, err_bytes);
  if (rc == 0)
    rc = read_contents(sd, err, err_bytes);
  if (rc == 0) {
    char data_path[SL_SAVEPOINT_PATH_BYTES + 16];
    struct stat st;
    snprintf(data_path, sizeof data_path, "%s/data.mdb", dir);
    if (stat(data_path, &st) == 0)
      sd->info.data_bytes = (uint64_t)st.st_size;
  }
  if (rc != 0) {
    sl_state_dir_close(sd);
    return rc;
  }
  assert(sd->info.checkpoint_count == 0 ||
         sd->ids[sd->info.checkpoint_count - 1] <= sd->info.latest);
  *out = sd;
  return 0;
}

const sl_state_dir_info *sl_state_dir_info_get(const sl_state_dir *sd) {
  assert(sd != 0);
  return &sd->info;
}

int sl_state_dir_checkpoint(sl_state_dir *sd, uint64_t id,
                            sl_inspect_checkpoint *out, char *err,
                            size_t err_bytes) {
  assert(sd != 0 && out != 0);
  memset(out, 0, sizeof *out);
  if (id == 0 || id > sd->info.latest)
    return sl_inspect_fail(err, err_bytes, SL_ENOTFOUND,
                           "%s: no checkpoint %" PRIu64
                           " (the newest is %" PRIu64 ")",
                           sd->path, id, sd->info.latest);
  void *record = 0;
  uint32_t bytes = 0;
  int rc = sl_store_get_checkpoint(sd->store, id, &record, &bytes);
  if (rc == SL_ENOTFOUND)
    return sl_inspect_fail(err, err_bytes, rc, "%s: no checkpoint %" PRIu64,
                           sd->path, id);
  if (rc != 0)
    return sl_inspect_fail(err, err_bytes, rc, "checkpoint %" PRIu64 ": %s", id,
                           sl_store_error(sd->store));
  const uint8_t *r = record;
  out->id = id;
  out->record_bytes = bytes;
  uint32_t version = bytes >= 4 ? le32(r) : 0;
  bool known = (version == 1 && bytes == RECORD_V1_BYTES) ||
               (version == 2 && bytes == RECORD_V2_BYTES) ||
               (version == 3 && bytes == RECORD_V3_BYTES);
  if (!known || le32(r + 4) > 1) {
    free(record);
    return sl_inspect_fail(
        err, err_bytes, SL_ECORRUPT,
        "%s: the record of checkpoint %" PRIu64 " is corrupt: %" PRIu32
        " bytes with version %" PRIu32 " (a version 1 record has %u "
        "bytes, a version 2 record %u, a version 3 record %u)",
        sd->path, id, bytes, version, RECORD_V1_BYTES, RECORD_V2_BYTES,
        RECORD_V3_BYTES);
  }
  out->record_version = version;
  out->final = (int)le32(r + 4);
  out->trigger_time_ms = (int64_t)le64(r + 8);
  out->instance_count = le64(r + 16);
  if (version >= 2) {
    out->has_sizes = 1;
    out->bytes_persisted = le64(r + 24);
    out->entries_persisted = le64(r + 32);
  }
  if (version >= 3) { /* an unaligned checkpoint */
    out->unaligned = le32(r + 40) != 0;
    out->channel_bytes = le64(r + 48);
  }
  free(record);
  return 0;
}

void sl_state_dir_close(sl_state_dir *sd) {
  if (!sd)
    return;
  sl_store_close(sd->store);
  free(sd->graph);
  free(sd->operators);
  free(sd->blobs);
  free(sd->ids);
  free(sd->path);
  free(sd);
}

char *sl_inspect_time_text(int64_t ms, char *out, size_t out_bytes) {
  assert(out_bytes >= 32);
  time_t secs = (time_t)(ms >= 0 ? ms / 1000 : (ms - 999) / 1000);
  int millis = (int)(ms - (int64_t)secs * 1000);
  struct tm tm;
  if (!gmtime_r(&secs, &tm)) {
    snprintf(out, out_bytes, "%" PRId64 " ms", ms);
    return out;
  }
  snprintf(out, out_bytes, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
           tm.tm_min, tm.tm_sec, millis);
  return out;
}
