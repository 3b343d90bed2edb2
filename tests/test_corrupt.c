/* test_corrupt.c — damaged state directories (issue 17), in the manner of
 * SQLite's corrupt*.test and dbfuzz: a small store written by a real
 * checkpointed job is damaged in every way below, one copy at a time, and
 * every reader and writer of it must give SL_ECORRUPT naming the file, or
 * exactly what the undamaged store gives.  Never a signal, a hang or a
 * sanitizer report (the suite runs in the ASan build too).
 *
 * The campaign (suite corrupt):
 * - every page header of data.mdb, 4 bytes flipped at each of its three
 *   fields (page number; pad and flags; lower and upper);
 * - data.mdb truncated at every page boundary (a 0-byte data.mdb is an
 *   interrupted creation, store.h note 4: read-only it is no store);
 * - random byte flips anywhere in data.mdb (seeded: SLUICE_CORRUPT_SEED,
 *   the seed is printed);
 * - lock.mdb and lock truncated or flipped (nothing live: exact result).
 * For each copy: a read-only open and a read of everything (blobs,
 * checkpoint records, the merged keyed state of every operator), the
 * inspection API of `sluice checkpoints`, and a writer that reads, then
 * commits two checkpoints with 65512-byte blobs (so LMDB allocates
 * overflow pages and reuses free ones), read back after.
 *
 * Beside it: the named crashes of the issue with a real job resumed on
 * the damaged directory, the CLI (SLUICE_BIN) on damaged directories,
 * `sluice checkpoints` writing nothing, the writer's lock surviving the
 * deletion of "lock", and a full disk (a real tmpfs) reported as such.
 *
 * To keep a copy that fails: with SLUICE_CORRUPT_KEEP=DIR set, a case
 * whose reader reads different data without an error first writes into
 * DIR (which must exist) undamaged.mdb (the fixture's data.mdb),
 * damaged.mdb (the copy) and label.txt (the case's label, its flips),
 * then fails (so does an inspection that lists other checkpoints).  The fixture comes from a timed job, so a seed alone does
 * not repeat a case from another run; the two files do (open a copy of
 * damaged.mdb as DIR2/data.mdb). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <dirent.h>
#include <unistd.h>

#include "inspect.h"
#include "sluice.h"
#include "sluice_testing.h" /* unstable test helpers */
#include "store.h"
#include "store_read.h"
#include "test_dirs.h"
#include "test_util.h"

#define SOURCE_P 2
#define KEYS 4096
#define OPS_MAX 8       /* operator ids of the job are below this */
#define BLOB_BYTES 65512 /* the size of the overflowing write */
#define DEFAULT_SEED 20261203u

/* ------------------------------------------------------------ helpers */

static const char *sluice_bin(void) {
  const char *bin = getenv("SLUICE_BIN");
  cr_assert(bin && *bin, "SLUICE_BIN is not set (meson sets it)");
  return bin;
}

static void write_bytes(const char *path, const void *data, size_t bytes) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
  cr_assert_eq(write(fd, data, bytes), (ssize_t)bytes);
  cr_assert_eq(close(fd), 0);
}

static void assert_contains(const char *text, const char *part) {
  cr_assert(text && strstr(text, part), "\"%s\" lacks \"%s\"",
            text ? text : "(null)", part);
}

/* The store's data.mdb in dir, read whole into memory (the caller frees
 * it; *bytes long), its path (*path, if path is not NULL; the caller
 * frees it) and its page size.  LMDB keeps the page size in meta page 0,
 * in the md_pad field of the free-pages DB: after the 16-byte page header
 * come the meta's magic and version (4 bytes each), address and map size
 * (8 each), then that DB, md_pad first.  The file holds whole pages. */
static uint8_t *read_data_file(const char *dir, char **path, size_t *bytes,
                               uint32_t *page_bytes) {
  char *data_path = sl_test_path_in(dir, "data.mdb");
  uint8_t *data = (uint8_t *)sl_test_read_file(data_path, bytes);
  cr_assert(data, "%s: %s", data_path, strerror(errno));
  cr_assert_geq(*bytes, 16 + 24 + sizeof *page_bytes);
  memcpy(page_bytes, data + 16 + 24, sizeof *page_bytes);
  cr_assert(*page_bytes >= 512 && *bytes % *page_bytes == 0,
            "%s: page size %" PRIu32 ", %zu bytes", data_path, *page_bytes,
            *bytes);
  if (path)
    *path = data_path;
  else
    free(data_path);
  return data;
}

/* xorshift64*: the campaign's random numbers, from its printed seed. */
static uint64_t next_random(uint64_t *state) {
  uint64_t x = *state;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *state = x;
  return x * 0x2545F4914F6CDD1Dull;
}

/* FNV-1a over everything a store gives a restore. */
static void mix(uint64_t *h, const void *data, size_t bytes) {
  const uint8_t *p = data;
  for (size_t i = 0; i < bytes; i++)
    *h = (*h ^ p[i]) * 0x100000001b3ull;
}

static void mix_u64(uint64_t *h, uint64_t v) { mix(h, &v, sizeof v); }

/* ------------------------------------------------------------ the job */

/* The job of the campaign's store: keyed source (2) -> verifying sink
 * (2), checkpoints every 5 ms, on state_dir (resumed if it holds a
 * checkpoint) or, with savepoint set, started from that savepoint.
 * Returns sl_job_run's result; on success the sink must have seen exactly
 * count records, in order. */
static int run_job_with(const char *state_dir, const char *savepoint,
                        uint64_t count, char *err, size_t err_bytes) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = 5;
  config.checkpoint.no_sync = 1;
  if (savepoint)
    config.checkpoint.from_savepoint = savepoint;
  else
    config.checkpoint.store_policy = SL_STORE_RESUME;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_keyed(job, "src", SOURCE_P, count, KEYS, &src), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", src, 2, count, KEYS, &sink), 0);
  int rc = sl_job_run(job);
  snprintf(err, err_bytes, "%s", sl_job_error(job));
  if (rc == 0) {
    sl_verify_counts v;
    cr_assert_eq(sl_verify_result(sink, &v), 0);
    cr_assert_eq(v.records, count, "a %s job's output differs",
                 savepoint ? "savepoint-started" : "resumed");
    cr_assert_eq(v.lost + v.duplicates + v.out_of_order, 0);
    /* The writer ran on the store: this run committed a checkpoint past
     * the one it restored (a finished job re-takes its final one). */
    uint64_t restored = 0;
    cr_assert_gt(sl_job_last_checkpoint(job, &restored), restored);
  }
  sl_job_destroy(job);
  return rc;
}

static int run_job(const char *state_dir, uint64_t count, char *err,
                   size_t err_bytes) {
  return run_job_with(state_dir, NULL, count, err, err_bytes);
}

/* ------------------------------------------------------------ digests */

static int digest_blob(void *arg, uint16_t op, uint16_t instance,
                       uint64_t checkpoint_id, const void *data,
                       uint32_t bytes) {
  uint64_t *h = arg;
  mix_u64(h, (uint64_t)op << 16 | instance);
  mix_u64(h, checkpoint_id);
  mix(h, data, bytes);
  return 0;
}

static int digest_state(void *arg, uint16_t key_group, const void *key,
                        uint32_t key_bytes, const void *value,
                        uint32_t value_bytes) {
  uint64_t *h = arg;
  mix_u64(h, key_group);
  mix(h, key, key_bytes);
  mix_u64(h, value_bytes);
  mix(h, value, value_bytes);
  return 0;
}

/* Everything a restore reads from st, hashed into *digest. */
static int store_digest(sl_store *st, uint64_t *digest) {
  uint64_t h = 0xcbf29ce484222325ull;
  sl_store_view view;
  int rc = sl_store_read_view(st, &view, digest_blob, &h);
  if (rc != 0)
    return rc;
  mix_u64(&h, view.latest);
  mix(&h, view.graph, strlen(view.graph));
  free(view.graph);
  uint64_t *ids = 0;
  size_t count = 0;
  if ((rc = sl_store_list_checkpoints(st, &ids, &count)) != 0)
    return rc;
  for (size_t i = 0; rc == 0 && i < count; i++) {
    void *record;
    uint32_t bytes;
    rc = sl_store_get_checkpoint(st, ids[i], &record, &bytes);
    if (rc == 0) {
      mix_u64(&h, ids[i]);
      mix(&h, record, bytes);
      free(record);
    }
  }
  free(ids);
  for (uint16_t op = 0; rc == 0 && op < OPS_MAX; op++)
    rc = sl_store_read_state(st, op, 0, UINT16_MAX, digest_state, &h);
  *digest = h;
  return rc;
}

/* The writes of a resumed job's writer: two checkpoints with large blobs
 * (overflow pages, then the first's freed pages reused) and some state. */
static int store_write(sl_store *st) {
  static uint8_t blob[BLOB_BYTES];
  for (int round = 0; round < 2; round++) {
    memset(blob, 'a' + round, sizeof blob);
    sl_store_txn *txn;
    int rc = sl_store_begin(st, &txn);
    if (rc != 0)
      return rc;
    for (uint16_t instance = 0; rc == 0 && instance < SOURCE_P; instance++)
      rc = sl_store_put_blob(txn, 0, instance, blob, sizeof blob);
    for (uint32_t key = 0; rc == 0 && key < 64; key++) {
      uint64_t value = key * 1000u + (uint64_t)round;
      rc = sl_store_put_state(txn, 1, (uint16_t)(key % 16), &key, sizeof key,
                              &value, sizeof value);
    }
    if (rc == 0)
      rc = sl_store_commit(txn, sl_store_latest(st) + 1, "x", 1);
    else
      sl_store_abort(txn);
    if (rc != 0)
      return rc;
  }
  return 0;
}


/* A savepoint of the job's end in sp (the job runs count records). */
static void job_savepoint(const char *state_dir, const char *sp,
                          uint64_t count) {
  sl_job_config config = SL_JOB_CONFIG_INIT;
  config.checkpoint.state_dir = state_dir;
  config.checkpoint.interval_ms = 5;
  config.checkpoint.no_sync = 1;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_keyed(job, "src", SOURCE_P, count, KEYS, &src), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", src, 2, count, KEYS, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_job_wait(job), 0, "%s", sl_job_error(job));
  char err[1024];
  cr_assert_eq(sl_job_savepoint(job, sp, 0, err, sizeof err), 0, "%s", err);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ fixture */

/* A store of a real job, kept in memory, and what its readers and its
 * writer give undamaged; the damaged copies go to `work`. */
typedef struct fixture {
  char *root, *state, *work;
  uint8_t *data, *lock_mdb; /* data.mdb and lock.mdb as the job left them */
  size_t data_bytes, lock_mdb_bytes;
  uint32_t page_bytes;
  char *graph;
  uint64_t latest, digest, digest_after;
  size_t checkpoint_count;
  uint64_t cases, refused; /* outcomes: all, and SL_ECORRUPT */
  const uint8_t *case_data; /* the damaged data.mdb of the running case */
  size_t case_bytes;
} fixture;

static fixture fx;

static uint64_t job_records(void) { return sl_test_scaled(20000, 2000); }

/* Runs the job on fx.state twice (the second resumes at the end and takes
 * a final checkpoint: at least two checkpoints, whatever the timing). */
static void job_store(void) {
  char err[1024];
  fx.root = sl_test_temp_dir("corrupt");
  fx.state = sl_test_path_in(fx.root, "state");
  fx.work = sl_test_path_in(fx.root, "work");
  cr_assert_eq(run_job(fx.state, job_records(), err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(run_job(fx.state, job_records(), err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(mkdir(fx.work, 0755), 0);
}

static void fixture_setup(void) {
  job_store();
  fx.data = read_data_file(fx.state, 0, &fx.data_bytes, &fx.page_bytes);
  char *path = sl_test_path_in(fx.state, "lock.mdb");
  fx.lock_mdb = (uint8_t *)sl_test_read_file(path, &fx.lock_mdb_bytes);
  free(path);
  cr_assert(fx.lock_mdb);
  sl_store_info info;
  char err[1024];
  cr_assert_eq(sl_store_inspect(fx.state, &info, err, sizeof err), 0, "%s",
               err);
  fx.graph = info.graph;
  fx.latest = info.latest;
  cr_assert(fx.latest >= 2);
  /* The undamaged outcomes, through the very paths the cases take. */
  sl_store *st;
  sl_store_options ro = {.read_only = 1};
  cr_assert_eq(sl_store_open(fx.state, &ro, &st, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(store_digest(st, &fx.digest), 0, "%s", sl_store_error(st));
  uint64_t *ids;
  cr_assert_eq(sl_store_list_checkpoints(st, &ids, &fx.checkpoint_count), 0);
  free(ids);
  sl_store_close(st);
  sl_store_options rw = {.graph_fingerprint = fx.graph, .no_sync = 1};
  cr_assert_eq(sl_store_open(fx.work, &rw, &st, err, sizeof err), 0);
  sl_store_close(st); /* an empty store: replaced by each case's copy */
  char *work_data = sl_test_path_in(fx.work, "data.mdb");
  write_bytes(work_data, fx.data, fx.data_bytes);
  free(work_data);
  cr_assert_eq(sl_store_open(fx.work, &rw, &st, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(store_write(st), 0, "%s", sl_store_error(st));
  sl_store_close(st);
  cr_assert_eq(sl_store_open(fx.work, &ro, &st, err, sizeof err), 0, "%s",
               err);
  cr_assert_eq(store_digest(st, &fx.digest_after), 0);
  sl_store_close(st);
}

static void fixture_teardown(void) {
  cr_log_info("%" PRIu64 " damaged copies: %" PRIu64 " refused with "
              "SL_ECORRUPT, %" PRIu64 " read exactly as undamaged",
              fx.cases, fx.refused, fx.cases - fx.refused);
  free(fx.data);
  free(fx.lock_mdb);
  free(fx.graph);
  free(fx.state);
  free(fx.work);
  if (fx.root)
    sl_test_remove_tree(fx.root);
  memset(&fx, 0, sizeof fx);
}

/* ------------------------------------------------------------ one case */

/* SLUICE_CORRUPT_KEEP (head comment): the running case's files, kept
 * before the assertion that fails on it. */
static void keep_case(const char *label) {
  const char *dir = getenv("SLUICE_CORRUPT_KEEP");
  if (!dir || !*dir || !fx.case_data)
    return;
  char *path = sl_test_path_in(dir, "undamaged.mdb");
  write_bytes(path, fx.data, fx.data_bytes);
  free(path);
  path = sl_test_path_in(dir, "damaged.mdb");
  write_bytes(path, fx.case_data, fx.case_bytes);
  free(path);
  path = sl_test_path_in(dir, "label.txt");
  write_bytes(path, label, strlen(label));
  free(path);
  fprintf(stderr, "kept the failing case in %s\n", dir);
}

/* The reader's digest must be the undamaged store's. */
static void assert_digest(uint64_t digest, uint64_t expected,
                          const char *label, const char *step) {
  if (digest != expected)
    keep_case(label);
  cr_assert_eq(digest, expected, "%s: %s without an error, but not what "
               "the undamaged store holds", label, step);
}

/* rc is 0, or SL_ECORRUPT with a message naming file.  Returns rc. */
static int outcome(int rc, const char *message, const char *file,
                   const char *label, const char *step) {
  cr_assert(rc == 0 || rc == SL_ECORRUPT,
            "%s, %s: rc %d (%s) instead of 0 or SL_ECORRUPT: %s", label,
            step, rc, sl_strerror(rc), message);
  if (rc != 0)
    assert_contains(message, file);
  return rc;
}

/* The copy in fx.work, read by a restore's reader. */
static int case_read(const char *label) {
  char err[1024] = "";
  sl_store *st;
  sl_store_options ro = {.read_only = 1};
  int rc = sl_store_open(fx.work, &ro, &st, err, sizeof err);
  if (outcome(rc, err, "data.mdb", label, "read-only open") != 0)
    return rc;
  uint64_t digest = 0;
  rc = store_digest(st, &digest);
  snprintf(err, sizeof err, "%s", sl_store_error(st));
  sl_store_close(st);
  if (outcome(rc, err, "data.mdb", label, "read") != 0)
    return rc;
  assert_digest(digest, fx.digest, label, "read");
  return 0;
}

/* The copy in fx.work, read by `sluice checkpoints`'s API. */
static void case_inspect(const char *label) {
  char err[1024] = "";
  sl_state_dir *sd;
  int rc = sl_state_dir_open(fx.work, 0, &sd, err, sizeof err);
  if (outcome(rc, err, "data.mdb", label, "inspect") != 0)
    return;
  const sl_state_dir_info *info = sl_state_dir_info_get(sd);
  bool refused = false;
  for (size_t i = 0; !refused && i < info->checkpoint_count; i++) {
    sl_inspect_checkpoint c;
    rc = sl_state_dir_checkpoint(sd, info->checkpoint_ids[i], &c, err,
                                 sizeof err);
    refused = outcome(rc, err, "data.mdb", label, "inspect a record") != 0;
  }
  if (!refused) {
    if (info->latest != fx.latest ||
        info->checkpoint_count != fx.checkpoint_count)
      keep_case(label);
    cr_assert_eq(info->latest, fx.latest, "%s: inspect", label);
    cr_assert_eq(info->checkpoint_count, fx.checkpoint_count, "%s", label);
  }
  sl_state_dir_close(sd);
}

/* The copy in fx.work, resumed by a writer: read, then two checkpoints. */
static void case_write(const char *label) {
  char err[1024] = "";
  sl_store *st;
  sl_store_options rw = {.graph_fingerprint = fx.graph, .no_sync = 1};
  int rc = sl_store_open(fx.work, &rw, &st, err, sizeof err);
  if (outcome(rc, err, "data.mdb", label, "writer open") != 0)
    return;
  uint64_t digest = 0;
  rc = store_digest(st, &digest);
  if (rc == 0) {
    assert_digest(digest, fx.digest, label, "writer read");
    rc = store_write(st);
  }
  snprintf(err, sizeof err, "%s", sl_store_error(st));
  sl_store_close(st);
  if (outcome(rc, err, "data.mdb", label, "writer") != 0)
    return;
  sl_store_options ro = {.read_only = 1};
  rc = sl_store_open(fx.work, &ro, &st, err, sizeof err);
  if (outcome(rc, err, "data.mdb", label, "reopen after writes") != 0)
    return;
  rc = store_digest(st, &digest);
  snprintf(err, sizeof err, "%s", sl_store_error(st));
  sl_store_close(st);
  if (outcome(rc, err, "data.mdb", label, "read after writes") == 0)
    assert_digest(digest, fx.digest_after, label, "read after writes");
}

/* Puts data (data.mdb) and, if given, lock.mdb and lock into fx.work. */
static void case_files(const uint8_t *data, size_t data_bytes,
                       const uint8_t *lock_mdb, size_t lock_mdb_bytes,
                       const char *lock, size_t lock_bytes) {
  static const char *const names[] = {"data.mdb", "lock.mdb", "lock"};
  for (size_t i = 0; i < 3; i++) {
    char *path = sl_test_path_in(fx.work, names[i]);
    unlink(path);
    if (i == 0)
      write_bytes(path, data, data_bytes);
    else if (i == 1 && lock_mdb)
      write_bytes(path, lock_mdb, lock_mdb_bytes);
    else if (i == 2 && lock)
      write_bytes(path, lock, lock_bytes);
    free(path);
  }
}

/* Every path on the damaged data.mdb of bytes data. */
static void run_case(const uint8_t *data, size_t data_bytes,
                     const char *label) {
  fx.cases++;
  fx.case_data = data;
  fx.case_bytes = data_bytes;
  case_files(data, data_bytes, 0, 0, 0, 0);
  int read = case_read(label);
  fx.refused += read != 0;
  case_files(data, data_bytes, 0, 0, 0, 0);
  case_inspect(label);
  case_files(data, data_bytes, 0, 0, 0, 0);
  case_write(label);
  fx.case_data = 0;
}

/* ------------------------------------------------------------ campaign */

TestSuite(corrupt, .init = fixture_setup, .fini = fixture_teardown,
          .timeout = 600);

Test(corrupt, every_page_header) {
  uint8_t *copy = malloc(fx.data_bytes);
  cr_assert(copy);
  size_t pages = fx.data_bytes / fx.page_bytes;
  static const size_t fields[] = {0, 8, 12}; /* pgno; pad, flags; lower, upper */
  uint64_t random = DEFAULT_SEED;
  for (size_t page = 0; page < pages; page++)
    for (size_t f = 0; f < 3; f++) {
      memcpy(copy, fx.data, fx.data_bytes);
      uint32_t flip = (uint32_t)next_random(&random) | 1u, word;
      size_t at = page * fx.page_bytes + fields[f];
      memcpy(&word, copy + at, sizeof word);
      word ^= flip;
      memcpy(copy + at, &word, sizeof word);
      char label[128];
      snprintf(label, sizeof label, "page %zu header bytes %zu..%zu ^ 0x%08x",
               page, fields[f], fields[f] + 3, flip);
      run_case(copy, fx.data_bytes, label);
    }
  free(copy);
  cr_assert(fx.refused > 0 && fx.refused < fx.cases,
            "some flips must be refused, some (of unused bytes) not");
}

/* LMDB's magic in meta page 0 damaged, meta page 1 whole: the file is
 * LMDB's, so every reader and the writer refuse it as corrupt (SL_ECORRUPT
 * naming data.mdb), not as a foreign file (random_byte_flips met this, a
 * flip among 4 bytes of the file). */
Test(corrupt, first_meta_magic) {
  uint8_t *copy = malloc(fx.data_bytes);
  cr_assert(copy);
  for (size_t at = 16; at < 20; at++) { /* the magic: LMDB_MAGIC_OFFSET */
    memcpy(copy, fx.data, fx.data_bytes);
    copy[at] ^= 0x52;
    char label[64];
    snprintf(label, sizeof label, "meta page 0 byte %zu ^ 0x52", at);
    uint64_t refused = fx.refused;
    run_case(copy, fx.data_bytes, label);
    cr_assert_eq(fx.refused, refused + 1, "%s: read as undamaged", label);
  }
  free(copy);
}

Test(corrupt, truncation_at_every_page) {
  size_t pages = fx.data_bytes / fx.page_bytes;
  for (size_t page = 1; page < pages; page++) {
    char label[64];
    snprintf(label, sizeof label, "truncated to %zu pages", page);
    run_case(fx.data, page * fx.page_bytes, label);
  }
  /* The sizes of the issue, and one inside a page. */
  run_case(fx.data, fx.data_bytes / 2, "truncated to half");
  run_case(fx.data, 8192, "truncated to 8 KiB");
  run_case(fx.data, fx.data_bytes - 100, "truncated inside the last page");
  /* Every truncation loses a live page, as the job's store is compact
   * at its end: each one must be refused. */
  cr_assert_eq(fx.refused, fx.cases, "a truncated store was read");
  /* 0 bytes: an interrupted creation (store.h note 4), no store. */
  case_files(fx.data, 0, 0, 0, 0, 0);
  sl_store *st;
  char err[1024];
  sl_store_options ro = {.read_only = 1};
  cr_assert_eq(sl_store_open(fx.work, &ro, &st, err, sizeof err), ENOENT);
}

Test(corrupt, random_byte_flips) {
  uint64_t seed = DEFAULT_SEED;
  const char *text = getenv("SLUICE_CORRUPT_SEED");
  if (text && *text)
    seed = strtoull(text, 0, 10);
  cr_log_info("random_byte_flips: seed %" PRIu64
              " (set SLUICE_CORRUPT_SEED to repeat another)", seed);
  fprintf(stderr, "corrupt::random_byte_flips seed %" PRIu64 "\n", seed);
  uint64_t random = seed ? seed : 1;
  uint8_t *copy = malloc(fx.data_bytes);
  cr_assert(copy);
  uint64_t copies = sl_test_scaled(600, 150);
  for (uint64_t n = 0; n < copies; n++) {
    memcpy(copy, fx.data, fx.data_bytes);
    int flips = 1 + (int)(next_random(&random) % 4);
    char label[160];
    int at = snprintf(label, sizeof label, "seed %" PRIu64 " copy %" PRIu64
                      ":", seed, n);
    for (int i = 0; i < flips; i++) {
      size_t offset = (size_t)(next_random(&random) % fx.data_bytes);
      uint8_t mask = (uint8_t)(next_random(&random) % 255 + 1);
      copy[offset] ^= mask;
      at += snprintf(label + at, sizeof label - (size_t)at, " [%zu]^%02x",
                     offset, mask);
    }
    run_case(copy, fx.data_bytes, label);
  }
  free(copy);
  cr_assert(fx.refused > 0, "no random flip was refused");
}

/* lock.mdb and lock hold nothing live once no process has the store:
 * whatever their damage, readers and writers give the exact result. */
Test(corrupt, lock_files) {
  uint64_t random = DEFAULT_SEED;
  uint8_t *lock_mdb = malloc(fx.lock_mdb_bytes);
  cr_assert(lock_mdb);
  for (int n = 0; n < 24; n++) {
    memcpy(lock_mdb, fx.lock_mdb, fx.lock_mdb_bytes);
    size_t bytes = fx.lock_mdb_bytes;
    if (n % 3 == 0)
      bytes = (size_t)(next_random(&random) % fx.lock_mdb_bytes);
    for (int i = 0; i < 8; i++)
      lock_mdb[next_random(&random) % fx.lock_mdb_bytes] ^= 0x5a;
    char lock[16];
    memset(lock, (int)(next_random(&random) & 0xff), sizeof lock);
    char label[64];
    snprintf(label, sizeof label, "lock.mdb damaged (%zu bytes), lock %d",
             bytes, n);
    fx.cases++;
    case_files(fx.data, fx.data_bytes, lock_mdb, bytes, lock, n % 16);
    cr_assert_eq(case_read(label), 0, "%s", label);
    case_files(fx.data, fx.data_bytes, lock_mdb, bytes, lock, n % 16);
    case_inspect(label);
    case_files(fx.data, fx.data_bytes, lock_mdb, bytes, lock, n % 16);
    case_write(label);
  }
  free(lock_mdb);
}

/* ------------------------------------------------------------ named crashes
 * The crashes of issue 17, each with a real job resumed on the damaged
 * directory: SL_ECORRUPT naming data.mdb, or the exact output. */

/* The newest meta page's root of the main database (always live). */
static uint64_t main_root_page(const uint8_t *data, uint32_t page_bytes) {
  uint64_t txnid[2], root[2];
  for (int i = 0; i < 2; i++) {
    const uint8_t *meta = data + (size_t)i * page_bytes + 16;
    memcpy(&txnid[i], meta + 128, sizeof txnid[i]);
    memcpy(&root[i], meta + 24 + 48 + 40, sizeof root[i]);
  }
  return root[txnid[0] < txnid[1] ? 1 : 0];
}

/* A real job resumed on fx.work holding data: the outcome.  The store's
 * job had finished, so its instances are restored as finished (they never
 * run again) and the writer commits a new final checkpoint over the
 * damaged store, with the instances' blobs. */
static int resume_case(const uint8_t *data, size_t bytes, const char *label) {
  case_files(data, bytes, 0, 0, 0, 0);
  char err[2048];
  int rc = run_job(fx.work, job_records(), err, sizeof err);
  fx.cases++;
  fx.refused += rc != 0;
  return outcome(rc, err, "data.mdb", label, "resumed job");
}

TestSuite(crash, .fini = fixture_teardown, .timeout = 600);

/* SIGBUS (exit 135) before: LMDB read past the end of the map. */
Test(crash, truncated_store_resume_refuses) {
  fixture_setup();
  cr_assert_neq(resume_case(fx.data, fx.data_bytes / 2, "half"), 0);
  cr_assert_neq(resume_case(fx.data, 8192, "8 KiB"), 0);
  char err[1024];
  sl_state_dir *sd;
  cr_assert_eq(sl_state_dir_open(fx.work, 0, &sd, err, sizeof err),
               SL_ECORRUPT);
  assert_contains(err, "data.mdb");
}

/* SIGSEGV in mdb_cursor_get <- merged_view <- sl_store_read_state, and
 * the heap-buffer-overflow WRITE in mdb_put <- sl_store_put_blob, before:
 * 4 bytes of a page header flipped, for every page, then a resume whose
 * writer goes on checkpointing. */
Test(crash, header_flips_then_resume_and_write) {
  fixture_setup();
  uint8_t *copy = malloc(fx.data_bytes);
  cr_assert(copy);
  size_t pages = fx.data_bytes / fx.page_bytes;
  for (size_t page = 0; page < pages; page++)
    for (size_t field = 8; field <= 12; field += 4) {
      memcpy(copy, fx.data, fx.data_bytes);
      size_t at = page * fx.page_bytes + field;
      for (int i = 0; i < 4; i++)
        copy[at + (size_t)i] ^= (uint8_t)(0x5a + i);
      char label[64];
      snprintf(label, sizeof label, "page %zu bytes %zu..%zu", page, field,
               field + 3);
      resume_case(copy, fx.data_bytes, label);
    }
  uint64_t root = main_root_page(fx.data, fx.page_bytes);
  memcpy(copy, fx.data, fx.data_bytes);
  copy[root * fx.page_bytes + 14] ^= 0x40; /* upper */
  cr_assert_neq(resume_case(copy, fx.data_bytes, "the main root's upper"), 0);
  free(copy);
  cr_assert(fx.refused > 0 && fx.refused < fx.cases);
}

/* ------------------------------------------------------------ the CLI */

/* Runs `sluice ARGS` (shell words); stdout and stderr into *out and *err
 * (malloc'd); the exit status (a signal fails the test). */
static int sluice(const char *args, char **out, char **err) {
  char *dir = sl_test_temp_dir("corrupt-cli");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s/out' 2>'%s/err'", sluice_bin(),
           args, dir, dir);
  int status = system(cmd);
  cr_assert(status != -1 && WIFEXITED(status), "%s: status %d", cmd, status);
  char *path = sl_test_path_in(dir, "out");
  *out = sl_test_slurp(path);
  free(path);
  path = sl_test_path_in(dir, "err");
  *err = sl_test_slurp(path);
  free(path);
  sl_test_remove_tree(dir);
  return WEXITSTATUS(status);
}

/* The count job of the CLI on root/state, output root/out. */
static void cli_job(const char *root, const char *extra, int want) {
  char args[2048], *out, *err;
  snprintf(args, sizeof args, "run count --records %" PRIu64 " --keys 500 "
           "--parallelism 2 --state-dir '%s/state' --output '%s/out' "
           "--no-sync --quiet %s", sl_test_scaled(200000, 20000), root, root,
           extra);
  int status = sluice(args, &out, &err);
  cr_assert_eq(status, want, "sluice %s: exit %d: %s", args, status, err);
  if (want != 0) { /* one line that names the damaged file */
    cr_assert(strchr(err, '\n') == err + strlen(err) - 1,
              "more than one line: %s", err);
    assert_contains(err, "data.mdb");
  }
  free(out);
  free(err);
}

TestSuite(cli, .timeout = 300);

/* `sluice checkpoints` and `sluice run --resume` on damaged directories:
 * one line naming data.mdb, exit status 1 (SIGBUS and SIGSEGV before). */
Test(cli, damaged_store_exit_1) {
  char *root = sl_test_temp_dir("corrupt-cli");
  cli_job(root, "", 0);
  char *state = sl_test_path_in(root, "state"), *data_path;
  size_t bytes;
  uint32_t page_bytes;
  uint8_t *data = read_data_file(state, &data_path, &bytes, &page_bytes);
  free(state);
  uint64_t root_page = main_root_page(data, page_bytes);
  for (int damage = 0; damage < 3; damage++) {
    size_t size = damage == 0 ? bytes / 2 : damage == 1 ? 8192 : bytes;
    if (damage == 2) /* the main root's lower and upper */
      for (size_t i = 12; i < 16; i++)
        data[root_page * page_bytes + i] ^= 0xa5;
    write_bytes(data_path, data, size);
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "checkpoints '%s/state'", root);
    cr_assert_eq(sluice(args, &out, &err), 1, "damage %d: %s", damage, err);
    cr_assert(strchr(err, '\n') == err + strlen(err) - 1, "%s", err);
    assert_contains(err, data_path);
    cr_assert_str_empty(out);
    free(out);
    free(err);
    cli_job(root, "--resume", 1);
  }
  free(data);
  free(data_path);
  sl_test_remove_tree(root);
}

/* One entry of a directory listing: name, size, mtime, content hash. */
typedef struct entry_state {
  char name[64];
  off_t size;
  struct timespec mtime;
  uint64_t hash;
} entry_state;

/* The listing of dir's files (their names sorted by ls), at most 16. */
static size_t dir_state(const char *dir, entry_state *entries) {
  static const char *const names[] = {"data.mdb", "lock.mdb", "lock",
                                      "manifest.json", "savepoints.jsonl"};
  size_t n = 0;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char *path = sl_test_path_in(dir, names[i]);
    struct stat st;
    if (stat(path, &st) == 0) {
      entry_state *e = &entries[n++];
      snprintf(e->name, sizeof e->name, "%s", names[i]);
      e->size = st.st_size;
      e->mtime = st.st_mtim;
      size_t bytes;
      char *data = sl_test_read_file(path, &bytes);
      e->hash = 0xcbf29ce484222325ull;
      mix(&e->hash, data, bytes);
      free(data);
    }
    free(path);
  }
  return n;
}

static void assert_same_state(const char *dir, const entry_state *before,
                              size_t count) {
  entry_state after[16];
  size_t n = dir_state(dir, after);
  cr_assert_eq(n, count, "%s: files were added or removed", dir);
  for (size_t i = 0; i < n; i++) {
    cr_assert_str_eq(after[i].name, before[i].name);
    cr_assert_eq(after[i].size, before[i].size, "%s", after[i].name);
    cr_assert_eq(after[i].hash, before[i].hash, "%s changed", after[i].name);
    cr_assert(after[i].mtime.tv_sec == before[i].mtime.tv_sec &&
                  after[i].mtime.tv_nsec == before[i].mtime.tv_nsec,
              "%s was written", after[i].name);
  }
  DIR *d = opendir(dir); /* nothing else appeared either */
  cr_assert(d);
  size_t others = 0;
  for (struct dirent *e; (e = readdir(d)) != 0;)
    others += e->d_name[0] != '.';
  closedir(d);
  cr_assert_eq(others, n, "%s holds a new file", dir);
}

/* `sluice checkpoints DIR` writes nothing: not in a state directory
 * without lock.mdb, nor one with it, nor in a partial savepoint. */
Test(cli, checkpoints_writes_nothing) {
  char *root = sl_test_temp_dir("corrupt-cli");
  cli_job(root, "", 0);
  char *state = sl_test_path_in(root, "state");
  char *partial = sl_test_path_in(root, "partial");
  cr_assert_eq(mkdir(partial, 0755), 0);
  char *from = sl_test_path_in(state, "data.mdb");
  char *to = sl_test_path_in(partial, "data.mdb");
  size_t bytes;
  char *data = sl_test_read_file(from, &bytes);
  write_bytes(to, data, bytes);
  free(data);
  const char *dirs[] = {state, state, partial};
  for (int i = 0; i < 3; i++) {
    if (i == 1) { /* the second time without lock.mdb */
      char *lock_mdb = sl_test_path_in(state, "lock.mdb");
      cr_assert_eq(unlink(lock_mdb), 0);
      free(lock_mdb);
    }
    entry_state before[16];
    size_t n = dir_state(dirs[i], before);
    char args[1024], *out, *err;
    snprintf(args, sizeof args, "checkpoints '%s'", dirs[i]);
    cr_assert_eq(sluice(args, &out, &err), 0, "%s", err);
    assert_contains(out, "checkpoint");
    assert_same_state(dirs[i], before, n);
    free(out);
    free(err);
  }
  free(from);
  free(to);
  free(state);
  free(partial);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ the lock */

TestSuite(lock, .timeout = 120);

/* Deleting "lock" while a writer runs lets no second writer in: the
 * writer's lock is on the directory itself.  Two real processes. */
Test(lock, deleted_lock_file_keeps_second_writer_out) {
  char *dir = sl_test_temp_dir("corrupt-lock");
  int ready[2], done[2];
  cr_assert_eq(pipe(ready), 0);
  cr_assert_eq(pipe(done), 0);
  sl_store_options rw = {.graph_fingerprint = "g", .no_sync = 1};
  /* The second writer's open below waits for the directory's lock until
   * it gives up (store.h note 5): 5 s by default.  What is tested is that
   * it is refused, not how long it waits, so the wait is short. */
  sl_store_options second = rw;
  second.lock_wait_ms = 50;
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) { /* the first writer */
    sl_store *st;
    char err[1024];
    char ok = sl_store_open(dir, &rw, &st, err, sizeof err) == 0 ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1 || read(done[0], &ok, 1) != 1)
      _exit(3);
    sl_store_close(st);
    _exit(0);
  }
  char ok;
  cr_assert_eq(read(ready[0], &ok, 1), 1);
  cr_assert_eq(ok, 'y', "the first writer could not open");
  char *lock = sl_test_path_in(dir, "lock");
  cr_assert_eq(unlink(lock), 0);
  sl_store *st;
  char err[1024];
  cr_assert_eq(sl_store_open(dir, &second, &st, err, sizeof err), SL_ESTORE,
               "a second writer got in: %s", err);
  assert_contains(err, "in use by another process");
  sl_store_options ro = {.read_only = 1}; /* a reader beside it may */
  cr_assert_eq(sl_store_open(dir, &ro, &st, err, sizeof err), 0, "%s", err);
  sl_store_close(st);
  cr_assert_eq(write(done[1], "x", 1), 1);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_assert_eq(sl_store_open(dir, &rw, &st, err, sizeof err), 0, "%s", err);
  sl_store_close(st);
  free(lock);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ full disk */

static char full_disk_mount[256];

static void full_disk_unmount(void) {
  if (full_disk_mount[0]) {
    umount2(full_disk_mount, MNT_DETACH);
    rmdir(full_disk_mount);
    full_disk_mount[0] = 0;
  }
}

TestSuite(full_disk, .fini = full_disk_unmount, .timeout = 120);

/* A commit on a full file system is "No space left on device", naming
 * data.mdb ("Input/output error" before: LMDB's short write).  A real
 * 2 MiB tmpfs. */
Test(full_disk, commit_reports_no_space) {
  char *dir = sl_test_temp_dir("corrupt-full");
  snprintf(full_disk_mount, sizeof full_disk_mount, "%s", dir);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=2m") != 0) {
    int e = errno;
    full_disk_mount[0] = 0;
    rmdir(dir);
    free(dir);
    cr_skip_test("cannot mount a 2 MiB tmpfs (%s): this test needs root "
                 "(CI runs it as root)", strerror(e));
  }
  char *state = sl_test_path_in(dir, "state");
  sl_store_options rw = {.graph_fingerprint = "g"};
  sl_store *st;
  char err[1024];
  cr_assert_eq(sl_store_open(state, &rw, &st, err, sizeof err), 0, "%s", err);
  static uint8_t blob[256 << 10];
  int rc = 0;
  /* Bounded: 2 MiB hold fewer than 64 blobs of 256 KiB. */
  for (uint16_t i = 0; rc == 0 && i < 64; i++) {
    memset(blob, i, sizeof blob);
    sl_store_txn *txn;
    cr_assert_eq(sl_store_begin(st, &txn), 0);
    rc = sl_store_put_blob(txn, 0, i, blob, sizeof blob);
    if (rc == 0)
      rc = sl_store_commit(txn, (uint64_t)i + 1, "r", 1);
    else
      sl_store_abort(txn);
  }
  cr_assert_eq(rc, ENOSPC, "rc %d: %s", rc, sl_store_error(st));
  assert_contains(sl_store_error(st), "No space left on device");
  assert_contains(sl_store_error(st), "data.mdb");
  cr_log_info("full disk: %s", sl_store_error(st));
  sl_store_close(st);
  free(state);
  free(dir);
}

/* ------------------------------------------------------------ savepoints */

TestSuite(savepoint_damage, .timeout = 600);

/* A job started from a damaged savepoint (data.mdb: every page header,
 * truncations, random flips; manifest.json: random flips): SL_ECORRUPT
 * naming data.mdb, a refusal naming manifest.json, or the exact output. */
Test(savepoint_damage, start_from_damaged_savepoint) {
  char *root = sl_test_temp_dir("corrupt-sp");
  char *state = sl_test_path_in(root, "state");
  char *sp = sl_test_path_in(root, "sp");
  uint64_t count = job_records();
  job_savepoint(state, sp, count);
  char *data_path, *manifest_path = sl_test_path_in(sp, "manifest.json");
  size_t data_bytes, manifest_bytes;
  uint32_t page_bytes;
  uint8_t *data = read_data_file(sp, &data_path, &data_bytes, &page_bytes);
  uint8_t *manifest = (uint8_t *)sl_test_read_file(manifest_path,
                                                   &manifest_bytes);
  cr_assert(manifest);
  uint8_t *copy = malloc(data_bytes > manifest_bytes ? data_bytes
                                                     : manifest_bytes);
  cr_assert(copy);
  size_t pages = data_bytes / page_bytes;
  uint64_t random = DEFAULT_SEED, cases = 0, refused = 0;
  size_t flips = (size_t)sl_test_scaled(60, 20);
  size_t total = 2 * pages + flips + flips;
  for (size_t c = 0; c < total; c++, cases++) {
    bool in_manifest = c >= 2 * pages + flips;
    const uint8_t *from = in_manifest ? manifest : data;
    size_t bytes = in_manifest ? manifest_bytes : data_bytes;
    memcpy(copy, from, bytes);
    char label[96];
    if (c < pages) { /* a page header's lower and upper */
      for (size_t i = 12; i < 16; i++)
        copy[c * page_bytes + i] ^= 0x5a;
      snprintf(label, sizeof label, "savepoint page %zu header", c);
    } else if (c < 2 * pages) {
      bytes = (c - pages) * page_bytes + page_bytes / 2;
      snprintf(label, sizeof label, "savepoint truncated to %zu", bytes);
    } else {
      size_t at = (size_t)(next_random(&random) % bytes);
      copy[at] ^= (uint8_t)(next_random(&random) % 255 + 1);
      snprintf(label, sizeof label, "%s byte %zu flipped",
               in_manifest ? "manifest.json" : "data.mdb", at);
    }
    write_bytes(in_manifest ? manifest_path : data_path, copy, bytes);
    char *target = sl_test_path_in(root, "target");
    char err[2048];
    int rc = run_job_with(target, sp, count, err, sizeof err);
    refused += rc != 0;
    if (in_manifest && rc == SL_ESTORE) /* a text: refused, naming it */
      assert_contains(err, "manifest.json");
    else
      outcome(rc, err, in_manifest ? "manifest.json" : "data.mdb", label,
              "start from the savepoint");
    write_bytes(in_manifest ? manifest_path : data_path, from,
                in_manifest ? manifest_bytes : data_bytes);
    int removed = sl_test_remove_path(target);
    cr_assert_eq(removed, 0, "%s: %s", target, strerror(removed));
    free(target);
  }
  cr_log_info("%" PRIu64 " damaged savepoints: %" PRIu64 " refused", cases,
              refused);
  cr_assert(refused > 0 && refused < cases);
  free(copy);
  free(data);
  free(manifest);
  free(data_path);
  free(manifest_path);
  free(state);
  free(sp);
  sl_test_remove_tree(root);
}

/* ------------------------------------------------------------ chunk heads
 * A chunk's head (u16 op, u16 first key group, u16 last key group) is
 * read to choose chunks before any checksum is (store_view.c note 1f).
 * Found by random_byte_flips (seed 2045, copy 288): a flip of the op's
 * high byte made op 2's only chunk look like op 0xc902's, so a read of op
 * 2 skipped it and returned no state, with rc 0. */

/* Op 1, key groups 10..20, one key each: one log chunk, inline in its
 * leaf, in a fresh store in dir. */
static void chunk_store(const char *dir) {
  sl_store *st = store_open_writer(dir);
  sl_store_txn *txn;
  cr_assert_eq(sl_store_begin(st, &txn), 0);
  for (uint16_t group = 10; group <= 20; group++) {
    uint32_t key = group, value = group * 7u;
    cr_assert_eq(sl_store_put_state(txn, 1, group, &key, sizeof key, &value,
                                    sizeof value),
                 0, "%s", sl_store_error(st));
  }
  cr_assert_eq(sl_store_commit(txn, 1, "r", 1), 0, "%s", sl_store_error(st));
  sl_store_close(st);
}

/* The byte offset in data of the value of the named database's first
 * entry (a one-leaf main database and a database of one level, as a
 * fresh small store has them; asserted); *key_at: of its key. */
static size_t first_value_at(const uint8_t *data, uint32_t page_bytes,
                             const char *name, size_t *key_at) {
  uint64_t page = main_root_page(data, page_bytes);
  for (int tree = 0; tree < 2; tree++) {
    const uint8_t *p = data + page * page_bytes;
    uint16_t flags, lower;
    memcpy(&flags, p + 10, sizeof flags);
    memcpy(&lower, p + 12, sizeof lower);
    cr_assert_eq(flags, 0x02, "page %" PRIu64 " is not a leaf", page);
    for (uint16_t i = 0; 16 + 2 * i < lower; i++) {
      uint16_t offset, node_flags, key_bytes;
      memcpy(&offset, p + 16 + 2 * i, sizeof offset);
      const uint8_t *node = p + offset;
      memcpy(&node_flags, node + 4, sizeof node_flags);
      memcpy(&key_bytes, node + 6, sizeof key_bytes);
      const uint8_t *value = node + 8 + key_bytes;
      if (tree == 1) { /* the database's first entry */
        *key_at = (size_t)(node + 8 - data);
        if (!(node_flags & 0x01)) /* F_BIGDATA: an overflow page */
          return (size_t)(value - data);
        uint64_t overflow;
        memcpy(&overflow, value, sizeof overflow);
        return overflow * page_bytes + 16;
      }
      if (key_bytes == strlen(name) && memcmp(node + 8, name, key_bytes) == 0) {
        cr_assert(node_flags & 0x02, "%s is not a database", name);
        memcpy(&page, value + 40, sizeof page); /* the record's root */
        break;
      }
      cr_assert(16 + 2 * (i + 1) < lower, "no database %s", name);
    }
  }
  cr_assert_fail("unreachable");
  return 0;
}

TestSuite(chunk_head, .timeout = 120);

Test(chunk_head, damaged_head_is_refused) {
  char *root = sl_test_temp_dir("corrupt-head");
  char *state = sl_test_path_in(root, "state");
  chunk_store(state);
  char *data_path;
  size_t bytes;
  uint32_t page_bytes;
  uint8_t *data = read_data_file(state, &data_path, &bytes, &page_bytes);
  size_t key_at;
  size_t head = first_value_at(data, page_bytes, "log", &key_at);
  uint16_t field[3]; /* the head: op, first group, last group */
  memcpy(field, data + head, sizeof field);
  cr_assert(field[0] == 1 && field[1] == 10 && field[2] == 20,
            "not the chunk's head: %u %u %u", field[0], field[1], field[2]);
  char err[1024];
  uint64_t entries;
  cr_assert_eq(store_read_range(state, 1, 0, UINT16_MAX, &entries, err, sizeof err),
               0, "%s", err);
  cr_assert_eq(entries, 11);
  cr_assert_eq(store_read_range(state, 1, 0, 12, &entries, err, sizeof err), 0);
  cr_assert_eq(entries, 3);
  cr_assert_eq(store_read_range(state, 1, 13, 30, &entries, err, sizeof err), 0);
  cr_assert_eq(entries, 8);
  /* The log key: u64 seq, u32 run, u16 op, u16 last group (big-endian). */
  cr_assert(data[key_at + 13] == 1 && data[key_at + 15] == 20);
  /* Each damage, and the reads of it that skipped the chunk unread. */
  static const struct {
    bool in_key;  /* else in the head */
    size_t at;    /* byte of the head or of the key */
    uint8_t mask;
    uint16_t first, last; /* the read's key groups */
  } damage[] = {
      {0, 1, 0xc9, 0, UINT16_MAX}, /* op 1 -> 0xc801: the seed 2045 case */
      {0, 0, 0x03, 0, UINT16_MAX}, /* op 1 -> 2 */
      {0, 4, 0x01, 0, UINT16_MAX}, /* last group 20 -> 21 */
      {0, 2, 0x1e, 0, UINT16_MAX}, /* first group 10 -> 20 */
      {0, 2, 0x05, 0, 12},         /* first group 10 -> 15, above the read */
      {0, 2, 0x07, 0, 12},         /* first group 10 -> 13, above the read */
      {1, 15, 0x18, 13, 30},       /* the key's last group 20 -> 12 */
      {1, 15, 0x18, 0, UINT16_MAX},
  };
  for (size_t d = 0; d < sizeof damage / sizeof damage[0]; d++) {
    size_t at = (damage[d].in_key ? key_at : head) + damage[d].at;
    data[at] ^= damage[d].mask;
    write_bytes(data_path, data, bytes);
    int rc = store_read_range(state, 1, damage[d].first, damage[d].last, &entries,
                        err, sizeof err);
    cr_assert_eq(rc, SL_ECORRUPT, "damage %zu: rc %d, %" PRIu64
                 " entries: %s", d, rc, entries, err);
    assert_contains(err, "data.mdb is damaged");
    assert_contains(err, "database log");
    data[at] ^= damage[d].mask;
  }
  write_bytes(data_path, data, bytes);
  cr_assert_eq(store_read_range(state, 1, 0, 12, &entries, err, sizeof err), 0);
  cr_assert_eq(entries, 3);
  free(data);
  free(data_path);
  free(state);
  sl_test_remove_tree(root); /* frees root */
}
