/* memory_bench.c — what keyed state costs in memory: resident set size
 * (RSS) per state entry, peak RSS, and the peak that a copy-on-write
 * checkpoint adds.
 *
 *   memory_bench [--quick] [--repeat R] [--json PATH]
 *
 * The job: a source of 16-byte tuples {key = i % K, value = i},
 * i = 0 .. 2N-1 -> key_by(key) -> a keyed operator that keeps one entry per
 * key (sl_state_update: an 8-byte count under the 8-byte key) and emits a
 * tuple the first time it sees a key -> a sink that counts them.  Two
 * passes over the keys, so every entry is written again after it exists.
 * Six variants, each run in a fresh process (this program re-executed
 * with --child), so no run inherits memory an earlier one left with the
 * allocator:
 *
 *   baseline    K = 1000: the same records through the same rings (rings
 *               are touched as they fill, so a shorter stream would touch
 *               fewer ring pages), but almost no state
 *   state       K = N
 *   checkpoint  K = N, exactly-once checkpointing into a temporary
 *               directory (no fsync, to keep the run short; memory does
 *               not depend on it): after the first pass the source
 *               triggers a checkpoint and waits until its barrier has left,
 *               so the operator freezes all N entries and the whole second
 *               pass then copies each one while the writer serializes the
 *               frozen versions (cow_map.h, notes 3-4); the final
 *               checkpoint at the end of input is a second one
 *   checkpoint-no-copy-pass  the same with the copy pass off (note 3)
 *   partial, partial-no-copy-pass  a second pass of keys / 10 records,
 *               with the copy pass and without (note 3)
 *
 * Each child reads its RSS (/proc/self/statm) before it builds the job and
 * after sl_job_run() returns, before sl_job_destroy(), which is what frees
 * keyed state (engine/graph.c, sl_job_free_compiled): the state is alive
 * then.  Peak RSS is VmHWM (/proc/self/status) and getrusage's ru_maxrss.
 * A sampler thread also records the peak of anonymous memory (RssAnon)
 * every 5 ms, to tell the heap from the LMDB file pages the checkpoint
 * variant maps.  The operator reports the map's own accounting
 * (sl_cow_map_memory_bytes: requested entry bytes and bucket tables,
 * before allocator rounding) at close, and its peak sampled every 4096
 * records.
 *
 *   bytes per entry = (growth of RSS over the state run - growth over the
 *                      baseline run of the same repeat) / N
 *   overhead        = bytes per entry - (8 + 8)
 *
 * For N = 1M and 10M (--quick: 100K and 1M), R repeats (3; --quick 1) of
 * the three variants, rotating which goes first; median, min and max.
 * Target: at most 64 bytes of overhead per entry at the largest N.
 *
 * NOTES ON THE CHECKPOINT'S MEMORY (issue 21, target 5)
 *
 * 1. The ratio.  Peak anonymous memory while a checkpoint runs / steady
 *    state = the checkpoint variant's sampled peak RssAnon / the state
 *    variant's sampled peak RssAnon, of the same repeat: the same records
 *    and keys, the only difference the checkpoint.  The checkpoint variant
 *    is the worst case of one checkpoint: its barrier freezes all N
 *    entries and the second pass then writes every one of them while the
 *    writer runs.  RssAnon leaves out the LMDB file's mapped pages (page
 *    cache, not the job's heap).  Target: <= 1.5 at 1M and 10M keys
 *    (--quick has only 1M of these).
 * 2. The job's memory bound, printed per size:
 *      bound = S + C * N * e + W
 *    S: the steady state (the state variant's peak RssAnon); e: the bytes
 *    one entry costs (RSS growth per entry, key, value, table slot and
 *    allocator rounding, so a copy of an entry costs at most that); C = 2
 *    (BOUND_VERSIONS): the versions of an entry a checkpoint can hold
 *    besides the live one, the one frozen for the running checkpoint and
 *    the one of the last complete checkpoint, kept for an in-memory
 *    rollback until the next completes (issue 21's design; with no
 *    rollback kept, 1 would do); W: the writer's buffers, bounded by the
 *    store's size: the disk blocks of the state directory at the end of
 *    the run, or the largest checkpoint's bytes persisted if more (an LMDB
 *    write transaction keeps its dirty pages in the heap, and a compaction
 *    that rewrites the base dirties up to the whole file; a chunk
 *    writer's buffers hold at most a checkpoint).  Every term is measured
 *    in the run through /proc, the file system and the public statistics;
 *    the line also says whether the measured peak is within it.
 * 3. The copy pass (sl_job_config.checkpoint_copy_pass_bytes) copies
 *    every entry of a large change set after the barrier, where copy on
 *    write copies only those written again before the checkpoint is
 *    durable.  The variant checkpoint-no-copy-pass runs the
 *    checkpoint variant with SL_COPY_PASS_OFF; its peak over the same
 *    steady state is printed next to target 5's, to show what the pass
 *    costs here.  In this job every entry is written again, so copy on
 *    write copies all of them too, and the two peaks come out alike.
 *    The pass's price shows where few entries are written again before
 *    the checkpoint completes: the variants partial and
 *    partial-no-copy-pass (with the pass and without) run the checkpoint
 *    variant with a second pass that writes 1 key in PARTIAL_EVERY
 *    (keys 0, 10, 20, ...) once, so copy on write copies a tenth of the
 *    entries and the pass all of them.  They run only up to
 *    SL_COW_COPY_PASS_ENTRIES keys (above, no pass runs at all); their
 *    peaks over the same steady state are printed on one line.
 * Each child checks its counts (records processed, keys created, keys
 * received by the sink, live keys in the map); a mismatch fails the run.
 */
#include <assert.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "fixtures.h"
#include "cow_map.h"
#include "internal.h" /* the instance's copy-on-write map, for its size */
#include "sluice.h"

#define MAX_REPEAT 50
#define KEY_BYTES 8u
#define VALUE_BYTES 8u
#define BASELINE_KEYS 1000u
#define SOURCE_BATCH 1024u       /* records per source next() */
#define SAMPLE_EVERY_RECORDS 4096u /* operator: map size sampling */
#define SAMPLER_PERIOD_NS 5000000L /* sampler thread: RssAnon */
/* The source waits for its checkpoint's barrier at most this many
 * next() calls of SOURCE_WAIT_NS each (10 s in all). */
#define SOURCE_WAIT_CALLS 100000u
#define SOURCE_WAIT_NS 100000L
#define TARGET_OVERHEAD_BYTES 64.0
/* Issue 21, target 5: peak anonymous memory while a checkpoint runs at
 * most this many times the steady state, judged from TARGET_MIN_KEYS. */
#define TARGET_ANON_RATIO 1.5
#define TARGET_MIN_KEYS 1000000u
/* Versions of an entry, beyond the live one, that checkpointing can hold
 * at once: see note 2 of the header. */
#define BOUND_VERSIONS 2.0

enum variant { VARIANT_BASELINE, VARIANT_STATE, VARIANT_CHECKPOINT,
               VARIANT_NO_PASS, VARIANT_PARTIAL, VARIANT_PARTIAL_NO_PASS,
               VARIANTS };
static const char *const variant_names[VARIANTS] = {
    "baseline", "state", "checkpoint", "checkpoint-no-copy-pass",
    "partial", "partial-no-copy-pass"};
/* Note 3: the partial variants' second pass writes 1 key in this many. */
#define PARTIAL_EVERY 10u

static bool variant_checkpoints(int variant) {
  return variant >= VARIANT_CHECKPOINT;
}

static bool variant_partial(int variant) {
  return variant == VARIANT_PARTIAL || variant == VARIANT_PARTIAL_NO_PASS;
}

static bool variant_no_pass(int variant) {
  return variant == VARIANT_NO_PASS || variant == VARIANT_PARTIAL_NO_PASS;
}

/* Note 3: the partial variants run where a copy pass can (a delta of at
 * most 4M versions, storage/cow_map.h); above, they would repeat the
 * others. */
static bool variant_runs(int variant, uint64_t keys) {
  return !variant_partial(variant) || keys <= SL_COW_COPY_PASS_ENTRIES;
}

/* What one child measured; printed on one line, read back by the parent. */
typedef struct child_result {
  uint64_t rss_before_bytes;
  uint64_t rss_end_bytes;
  uint64_t hwm_bytes;        /* VmHWM */
  uint64_t maxrss_bytes;     /* ru_maxrss */
  uint64_t anon_peak_bytes;  /* sampled RssAnon */
  uint64_t map_bytes;        /* sl_cow_map_memory_bytes at close */
  uint64_t map_peak_bytes;   /* its sampled peak */
  uint64_t checkpoints;      /* newest complete checkpoint id */
  uint64_t wall_us;          /* sl_job_run */
  uint64_t anon_end_bytes;   /* RssAnon at the end, the state alive */
  uint64_t checkpoint_bytes_max; /* the largest checkpoint's bytes */
  uint64_t store_bytes;      /* the state directory's allocated bytes */
} child_result;
#define CHILD_FIELDS 12

/* ------------------------------------------------------------ /proc */

static uint64_t rss_now_bytes(void) {
  FILE *file = fopen("/proc/self/statm", "r");
  unsigned long long size_pages = 0, resident_pages = 0;
  if (!file)
    return 0;
  int read = fscanf(file, "%llu %llu", &size_pages, &resident_pages);
  fclose(file);
  assert(read != 2 || resident_pages <= size_pages);
  return read == 2 ? resident_pages * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

/* A "Name:   N kB" line of /proc/self/status, in bytes (0 if absent). */
static uint64_t status_bytes(const char *name) {
  FILE *file = fopen("/proc/self/status", "r");
  if (!file)
    return 0;
  size_t name_length = strlen(name);
  assert(name_length > 0);
  char line[256];
  uint64_t bytes = 0;
  for (int i = 0; i < 200 && fgets(line, sizeof line, file); i++) {
    if (strncmp(line, name, name_length) != 0 || line[name_length] != ':')
      continue;
    bytes = strtoull(line + name_length + 1, 0, 10) * 1024u;
    break;
  }
  fclose(file);
  return bytes;
}

typedef struct sampler {
  pthread_t thread;
  _Atomic bool stop;
  uint64_t anon_peak_bytes;
} sampler;

static void *sampler_main(void *arg) {
  sampler *s = arg;
  const struct timespec period = {0, SAMPLER_PERIOD_NS};
  /* Bounded by the run: the child's job ends or fails, then stop is set. */
  while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
    uint64_t anon_bytes = status_bytes("RssAnon");
    if (anon_bytes > s->anon_peak_bytes)
      s->anon_peak_bytes = anon_bytes;
    nanosleep(&period, 0);
  }
  return 0;
}

/* ------------------------------------------------------------ the job */

/* Shared by the source, operator and sink (one instance each). */
typedef struct run_state {
  sl_job *job;
  uint64_t records; /* 2 * keys; partial: keys + keys / PARTIAL_EVERY */
  uint64_t keys;
  bool checkpoint;
  bool partial; /* note 3 */
  /* source */
  uint64_t emitted;
  int phase; /* 0: first pass, 1: waiting for the barrier, 2: the rest */
  uint32_t wait_calls;
  _Atomic uint64_t snapshots;
  /* operator */
  uint64_t processed;
  uint64_t created;
  uint64_t map_bytes;
  uint64_t map_peak_bytes;
  uint64_t map_count;
  /* sink */
  uint64_t received;
} run_state;

/* Every operator's instance state is the shared run_state (one instance
 * each). */
static int share_open(sl_ctx *ctx, void *user, void **instance_state) {
  (void)ctx;
  *instance_state = user;
  return 0;
}

/* Wait for the barrier of the checkpoint triggered after the first pass:
 * the engine calls snapshot() between two next() calls. */
static int source_wait(sl_ctx *ctx, run_state *s) {
  assert(s->phase == 1);
  if (atomic_load(&s->snapshots) > 0) {
    s->phase = 2;
    return 0;
  }
  if (++s->wait_calls > SOURCE_WAIT_CALLS) {
    sl_ctx_fail(ctx, "no checkpoint barrier within 10 s of the trigger");
    return -ETIMEDOUT;
  }
  const struct timespec pause = {0, SOURCE_WAIT_NS};
  nanosleep(&pause, 0);
  return 0;
}

static int source_next(sl_ctx *ctx, void *instance_state) {
  run_state *s = instance_state;
  if (s->phase == 1)
    return source_wait(ctx, s);
  uint64_t limit = s->checkpoint && s->phase == 0 ? s->keys : s->records;
  if (s->emitted == limit && limit < s->records) {
    int rc = sl_job_trigger_checkpoint(s->job, 0);
    if (rc) {
      sl_ctx_fail(ctx, "trigger: %s", sl_strerror(rc));
      return rc < 0 ? rc : -rc;
    }
    s->phase = 1;
    return 0;
  }
  sl_tuple batch[SOURCE_BATCH];
  uint64_t count = limit - s->emitted;
  count = count < SOURCE_BATCH ? count : SOURCE_BATCH;
  for (uint64_t i = 0; i < count; i++) {
    uint64_t index = s->emitted + i;
    uint64_t key = !s->partial || index < s->keys
                       ? index % s->keys
                       : (index - s->keys) * PARTIAL_EVERY; /* note 3 */
    batch[i] = (sl_tuple){.key = key, .value = index};
  }
  int rc = sl_emit_batch(ctx, batch, sizeof batch[0], (uint32_t)count);
  if (rc)
    return rc < 0 ? rc : -rc;
  s->emitted += count;
  assert(s->emitted <= s->records);
  return s->emitted == s->records ? SL_SOURCE_END : 0;
}

static int source_snapshot(sl_ctx *ctx, void *instance_state,
                           uint64_t checkpoint_id) {
  (void)checkpoint_id;
  run_state *s = instance_state;
  atomic_fetch_add(&s->snapshots, 1);
  return sl_operator_state_set(ctx, &s->emitted, sizeof s->emitted);
}

/* Count the key's records in its state; emit the key when it is new. */
static int count_process(sl_ctx *ctx, void *instance_state, int input,
                         const sl_record *in) {
  (void)input;
  run_state *s = instance_state;
  void *value;
  int rc = sl_state_update(ctx, 0, VALUE_BYTES, 0, &value);
  if (rc) {
    sl_ctx_fail(ctx, "keyed state: %s", sl_strerror(rc));
    return rc < 0 ? rc : -rc;
  }
  uint64_t count;
  memcpy(&count, value, sizeof count);
  count++;
  memcpy(value, &count, sizeof count);
  if (++s->processed % SAMPLE_EVERY_RECORDS == 0) {
    uint64_t bytes = sl_cow_map_memory_bytes(ctx->cp.keyed);
    s->map_peak_bytes = bytes > s->map_peak_bytes ? bytes : s->map_peak_bytes;
  }
  if (count > 1)
    return 0;
  s->created++;
  return sl_emit(ctx, in->data, in->size_bytes);
}

static void count_close(sl_ctx *ctx, void *instance_state) {
  run_state *s = instance_state;
  assert(ctx->cp.keyed);
  s->map_bytes = sl_cow_map_memory_bytes(ctx->cp.keyed);
  s->map_count = sl_cow_map_count(ctx->cp.keyed);
  if (s->map_bytes > s->map_peak_bytes)
    s->map_peak_bytes = s->map_bytes;
}

static int sink_process(sl_ctx *ctx, void *instance_state, int input,
                        const sl_record *in) {
  (void)ctx, (void)input, (void)in;
  run_state *s = instance_state;
  s->received++;
  return 0;
}

/* Build the job of s into *job (created with config). */
static int build_job(const sl_job_config *config, run_state *s, sl_job **job) {
  static const sl_source_ops source_ops = {
      .open = share_open, .next = source_next, .snapshot = source_snapshot};
  static const sl_process_ops count_ops = {
      .open = share_open, .process = count_process, .close = count_close};
  static const sl_process_ops sink_ops = {.open = share_open,
                                          .process = sink_process};
  const fixture_keyed_spec keyed = {.count_ops = &count_ops,
                                    .count_user = s,
                                    .sink_ops = &sink_ops,
                                    .sink_user = s};
  sl_op *src, *sink;
  int rc = sl_job_create(config, job);
  if (rc)
    return rc;
  s->job = *job;
  rc = sl_op_source(*job, "source", 1, &source_ops, s, &src);
  if (!rc)
    rc = fixture_keyed_job(*job, src, &keyed, &sink);
  return rc;
}

/* Check the counts of a finished run; prints the first mismatch. */
static bool check_counts(const run_state *s) {
  assert(s->keys <= s->records);
  if (s->processed == s->records && s->created == s->keys &&
      s->received == s->keys && s->map_count == s->keys)
    return true;
  fprintf(stderr,
          "memory_bench: WRONG COUNT: processed %" PRIu64 " of %" PRIu64
          ", keys created %" PRIu64 ", received %" PRIu64 ", in the map %"
          PRIu64 "; expected %" PRIu64 " keys\n", s->processed, s->records,
          s->created, s->received, s->map_count, s->keys);
  return false;
}

/* nftw's accumulator for dir_allocated_bytes (one walk at a time: the
 * child's main thread is the only caller). */
static uint64_t walked_bytes;

static int add_allocated(const char *path, const struct stat *st, int flag,
                         struct FTW *ftw) {
  (void)path, (void)ftw;
  if (flag == FTW_F)
    walked_bytes += (uint64_t)st->st_blocks * 512u; /* st_blocks: 512 B */
  return 0;
}

/* Disk blocks allocated to the files under dir (sparse parts left out),
 * whatever files the store keeps there; 0 if it cannot be walked. */
static uint64_t dir_allocated_bytes(const char *dir) {
  walked_bytes = 0;
  if (nftw(dir, add_allocated, 16, FTW_PHYS) != 0)
    return 0;
  return walked_bytes;
}

/* The most bytes one checkpoint of job persisted (of the 64 kept). */
static uint64_t largest_checkpoint_bytes(const sl_job *job) {
  uint64_t most = 0;
  sl_checkpoint_stats cs;
  for (int k = 0; k < 64 && sl_job_checkpoint_stats(job, k, &cs) == 0; k++)
    most = cs.bytes_persisted > most ? cs.bytes_persisted : most;
  return most;
}

/* Run one variant and fill *out.  Returns 0, or 1 after printing why. */
static int run_variant(int variant, uint64_t keys, child_result *out) {
  static run_state s; /* static: read by the engine's threads */
  s = (run_state){.records = variant_partial(variant)
                                 ? keys + keys / PARTIAL_EVERY
                                 : 2 * keys,
                  .keys = variant == VARIANT_BASELINE ? BASELINE_KEYS : keys,
                  .checkpoint = variant_checkpoints(variant),
                  .partial = variant_partial(variant)};
  char dir[] = "/tmp/sluice-memory-bench-XXXXXX";
  sl_job_config config = SL_JOB_CONFIG_INIT;
  if (s.checkpoint) {
    if (!mkdtemp(dir))
      return perror("memory_bench: mkdtemp"), 1;
    config.checkpoint.state_dir = dir;
    config.checkpoint.interval_ms = 3600000; /* only the triggered one */
    config.checkpoint.no_sync = 1;
    config.checkpoint.store_policy = SL_STORE_FRESH;
    if (variant_no_pass(variant)) /* note 3 */
      config.checkpoint_copy_pass_bytes = SL_COPY_PASS_OFF;
  }
  sampler smp = {0};
  out->rss_before_bytes = rss_now_bytes();
  bool sampling = pthread_create(&smp.thread, 0, sampler_main, &smp) == 0;
  sl_job *job = 0;
  int rc = build_job(&config, &s, &job);
  uint64_t start_ns = bench_now_ns();
  if (!rc)
    rc = sl_job_run(job);
  out->wall_us = (bench_now_ns() - start_ns) / 1000;
  out->rss_end_bytes = rss_now_bytes(); /* before destroy: state alive */
  atomic_store(&smp.stop, true);
  if (sampling)
    pthread_join(smp.thread, 0);
  out->anon_peak_bytes = smp.anon_peak_bytes;
  out->hwm_bytes = status_bytes("VmHWM");
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  out->maxrss_bytes = (uint64_t)usage.ru_maxrss * 1024u;
  out->map_bytes = s.map_bytes;
  out->map_peak_bytes = s.map_peak_bytes;
  out->checkpoints = job ? sl_job_last_checkpoint(job, 0) : 0;
  out->anon_end_bytes = status_bytes("RssAnon");
  out->checkpoint_bytes_max = job ? largest_checkpoint_bytes(job) : 0;
  if (rc)
    fprintf(stderr, "memory_bench: %s: %s\n", sl_strerror(rc),
            job && sl_job_error(job)[0] ? sl_job_error(job) : "");
  sl_job_destroy(job);
  out->store_bytes = s.checkpoint ? dir_allocated_bytes(dir) : 0;
  if (s.checkpoint)
    fixture_remove_tree(dir);
  return rc || !check_counts(&s) ? 1 : 0;
}

/* --child VARIANT KEYS: one run, its results on one line of stdout. */
static int child_main(int variant, uint64_t keys) {
  if (variant < 0 || variant >= VARIANTS || keys < BASELINE_KEYS)
    return 2;
  child_result r;
  if (run_variant(variant, keys, &r) != 0)
    return 1;
  printf("%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
         " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
         " %" PRIu64 " %" PRIu64 "\n",
         r.rss_before_bytes, r.rss_end_bytes, r.hwm_bytes, r.maxrss_bytes,
         r.anon_peak_bytes, r.map_bytes, r.map_peak_bytes, r.checkpoints,
         r.wall_us, r.anon_end_bytes, r.checkpoint_bytes_max, r.store_bytes);
  return 0;
}

/* ------------------------------------------------------------ the parent */

/* This program's file, for the children (read from /proc/self/exe: in the
 * shell popen starts, argv[0] could name something else). */
static char self_path[4096];

static int run_child(int variant, uint64_t keys, child_result *r) {
  char command[sizeof self_path + 64];
  snprintf(command, sizeof command, "'%s' --child %d %" PRIu64, self_path,
           variant, keys);
  FILE *child = popen(command, "r");
  if (!child)
    return 1;
  unsigned long long v[CHILD_FIELDS] = {0};
  int read = fscanf(child, "%llu %llu %llu %llu %llu %llu %llu %llu %llu "
                    "%llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                    &v[6], &v[7], &v[8], &v[9], &v[10], &v[11]);
  int status = pclose(child);
  if (status != 0 || read != CHILD_FIELDS) {
    fprintf(stderr, "memory_bench: %s run of %" PRIu64 " keys failed\n",
            variant_names[variant], keys);
    return 1;
  }
  *r = (child_result){v[0], v[1], v[2], v[3], v[4], v[5],
                      v[6], v[7], v[8], v[9], v[10], v[11]};
  return 0;
}

/* One size's figures: for each repeat, the derived values. */
typedef struct size_runs {
  uint64_t keys;
  int repeat;
  child_result runs[VARIANTS][MAX_REPEAT];
  double bytes_per_entry[MAX_REPEAT];
  double overhead_per_entry[MAX_REPEAT];
  double map_bytes_per_entry[MAX_REPEAT];
  double checkpoint_extra_per_entry[MAX_REPEAT]; /* peak: checkpoint - state */
  double anon_ratio[MAX_REPEAT];   /* target 5: peak anon, cp / steady */
  double no_pass_ratio[MAX_REPEAT]; /* the same, copy pass off (note 3) */
  double partial_ratio[MAX_REPEAT];  /* partial variants (note 3) */
  double partial_no_pass_ratio[MAX_REPEAT];
  double bound_bytes[MAX_REPEAT];  /* the job's memory bound (note 2) */
} size_runs;

/* W of note 2: the store's allocated bytes, or the largest checkpoint's
 * if that is more. */
static uint64_t writer_bytes(const child_result *cp) {
  return cp->store_bytes > cp->checkpoint_bytes_max ? cp->store_bytes
                                                    : cp->checkpoint_bytes_max;
}

/* Peak RssAnon of variant's run r over steady (0 if steady is 0). */
static double peak_over(const size_runs *z, int variant, int r,
                        double steady) {
  return steady > 0 ? (double)z->runs[variant][r].anon_peak_bytes / steady
                    : 0;
}

static void derive(size_runs *z, int r) {
  const child_result *base = &z->runs[VARIANT_BASELINE][r];
  const child_result *state = &z->runs[VARIANT_STATE][r];
  const child_result *cp = &z->runs[VARIANT_CHECKPOINT][r];
  assert(z->keys > 0);
  double keys = (double)z->keys;
  double state_growth = (double)state->rss_end_bytes -
                        (double)state->rss_before_bytes;
  double base_growth = (double)base->rss_end_bytes -
                       (double)base->rss_before_bytes;
  z->bytes_per_entry[r] = (state_growth - base_growth) / keys;
  z->overhead_per_entry[r] = z->bytes_per_entry[r] - KEY_BYTES - VALUE_BYTES;
  z->map_bytes_per_entry[r] =
      ((double)state->map_bytes - (double)base->map_bytes) / keys;
  z->checkpoint_extra_per_entry[r] =
      ((double)cp->hwm_bytes - (double)state->hwm_bytes) / keys;
  double steady = (double)state->anon_peak_bytes;
  z->anon_ratio[r] = peak_over(z, VARIANT_CHECKPOINT, r, steady);
  z->no_pass_ratio[r] = peak_over(z, VARIANT_NO_PASS, r, steady);
  z->partial_ratio[r] = peak_over(z, VARIANT_PARTIAL, r, steady);
  z->partial_no_pass_ratio[r] =
      peak_over(z, VARIANT_PARTIAL_NO_PASS, r, steady);
  double entry = z->bytes_per_entry[r] > 0 ? z->bytes_per_entry[r] : 0;
  z->bound_bytes[r] = steady + BOUND_VERSIONS * keys * entry +
                      (double)writer_bytes(cp);
}

static int run_size(size_runs *z) {
  assert(z->repeat >= 1 && z->repeat <= MAX_REPEAT);
  for (int r = 0; r < z->repeat; r++) {
    for (int k = 0; k < VARIANTS; k++) {
      int variant = (r + k) % VARIANTS; /* rotate which goes first */
      if (variant_runs(variant, z->keys) &&
          run_child(variant, z->keys, &z->runs[variant][r]) != 0)
        return 1;
    }
    derive(z, r);
  }
  return 0;
}

/* Median/min/max of one field of one variant's runs. */
static bench_stats field_stats(const size_runs *z, int variant,
                               size_t offset) {
  double values[MAX_REPEAT];
  for (int r = 0; r < z->repeat; r++) {
    uint64_t v;
    memcpy(&v, (const char *)&z->runs[variant][r] + offset, sizeof v);
    values[r] = (double)v;
  }
  return bench_stats_of(values, (size_t)z->repeat);
}
#define FIELD(variant, name) \
  field_stats(z, variant, offsetof(child_result, name))

/* W of note 2 over the repeats. */
static bench_stats writer_stats(const size_runs *z) {
  double values[MAX_REPEAT];
  for (int r = 0; r < z->repeat; r++)
    values[r] = (double)writer_bytes(&z->runs[VARIANT_CHECKPOINT][r]);
  return bench_stats_of(values, (size_t)z->repeat);
}

/* Target 5 and the bound of one size (the notes on the checkpoint's
 * memory). */
static void print_checkpoint_memory(const size_runs *z) {
  const double mib = 1024.0 * 1024.0;
  size_t n = (size_t)z->repeat;
  bench_stats steady = field_stats(z, VARIANT_STATE,
                                   offsetof(child_result, anon_peak_bytes));
  bench_stats peak = field_stats(z, VARIANT_CHECKPOINT,
                                 offsetof(child_result, anon_peak_bytes));
  bench_stats writer = writer_stats(z);
  bench_stats ratio = bench_stats_of(z->anon_ratio, n);
  bench_stats bound = bench_stats_of(z->bound_bytes, n);
  bench_stats entry = bench_stats_of(z->bytes_per_entry, n);
  bool judged = z->keys >= TARGET_MIN_KEYS;
  printf("  target 5, %" PRIu64 " keys: peak RssAnon while a checkpoint "
         "runs %.1f MiB / steady %.1f MiB = %.2f [%.2f-%.2f] (<= %.1f): "
         "%s\n", z->keys, peak.median / mib, steady.median / mib,
         ratio.median, ratio.min, ratio.max, TARGET_ANON_RATIO,
         !judged ? "not judged below 1M keys"
                 : ratio.median <= TARGET_ANON_RATIO ? "met" : "NOT met");
  bench_stats off = bench_stats_of(z->no_pass_ratio, n);
  printf("  with the copy pass off (note 3), %" PRIu64 " keys: %.2f "
         "[%.2f-%.2f] of steady\n", z->keys, off.median, off.min, off.max);
  if (variant_runs(VARIANT_PARTIAL, z->keys)) {
    bench_stats on = bench_stats_of(z->partial_ratio, n);
    bench_stats no = bench_stats_of(z->partial_no_pass_ratio, n);
    printf("  1 key in %u written again while the checkpoint runs (note 3), "
           "%" PRIu64 " keys: %.2f [%.2f-%.2f] of steady with the copy "
           "pass, %.2f [%.2f-%.2f] without\n", PARTIAL_EVERY, z->keys,
           on.median, on.min, on.max, no.median, no.min, no.max);
  }
  printf("  the job's memory bound, %" PRIu64 " keys: steady + %.0f versions "
         "x keys x bytes/entry + writer = %.1f + %.0f x %" PRIu64 " x %.1f B "
         "+ %.1f = %.1f MiB (%.1f B per key); peak %s it\n", z->keys,
         BOUND_VERSIONS, steady.median / mib, BOUND_VERSIONS, z->keys,
         entry.median, writer.median / mib, bound.median / mib,
         bound.median / (double)z->keys,
         peak.median <= bound.median ? "within" : "ABOVE");
  fflush(stdout);
}

static void json_checkpoint_memory(bench_json *json, const size_runs *z) {
  size_t n = (size_t)z->repeat;
  bench_stats steady = field_stats(z, VARIANT_STATE,
                                   offsetof(child_result, anon_peak_bytes));
  bench_stats peak = field_stats(z, VARIANT_CHECKPOINT,
                                 offsetof(child_result, anon_peak_bytes));
  bench_stats ratio = bench_stats_of(z->anon_ratio, n);
  bench_stats bound = bench_stats_of(z->bound_bytes, n);
  bench_stats writer = writer_stats(z);
  bench_json_begin_object(json, "checkpoint_memory");
  bench_json_stats(json, "steady_anon_bytes", steady);
  bench_json_stats(json, "peak_anon_bytes", peak);
  /* a cross-check of steady: the state variant's RssAnon at its end */
  bench_json_stats(json, "steady_anon_end_bytes",
                   field_stats(z, VARIANT_STATE,
                               offsetof(child_result, anon_end_bytes)));
  bench_json_stats(json, "ratio", ratio);
  bench_json_stats(json, "ratio_copy_pass_off",
                   bench_stats_of(z->no_pass_ratio, n));
  bench_json_stats(json, "peak_anon_copy_pass_off_bytes",
                   field_stats(z, VARIANT_NO_PASS,
                               offsetof(child_result, anon_peak_bytes)));
  if (variant_runs(VARIANT_PARTIAL, z->keys)) {
    bench_json_u64(json, "partial_every", PARTIAL_EVERY);
    bench_json_stats(json, "ratio_partial",
                     bench_stats_of(z->partial_ratio, n));
    bench_json_stats(json, "ratio_partial_copy_pass_off",
                     bench_stats_of(z->partial_no_pass_ratio, n));
  }
  bench_json_double(json, "ratio_max", TARGET_ANON_RATIO);
  bench_json_bool(json, "judged", z->keys >= TARGET_MIN_KEYS);
  bench_json_bool(json, "met", ratio.median <= TARGET_ANON_RATIO);
  bench_json_stats(json, "bound_bytes", bound);
  bench_json_double(json, "bound_versions", BOUND_VERSIONS);
  bench_json_stats(json, "bound_entry_bytes",
                   bench_stats_of(z->bytes_per_entry, n));
  bench_json_stats(json, "bound_writer_bytes", writer);
  bench_json_bool(json, "peak_within_bound", peak.median <= bound.median);
  bench_json_end_object(json);
}

static void print_size(const size_runs *z) {
  const double mib = 1024.0 * 1024.0;
  bench_stats rss = FIELD(VARIANT_STATE, rss_end_bytes);
  bench_stats base = FIELD(VARIANT_BASELINE, rss_end_bytes);
  bench_stats per = bench_stats_of(z->bytes_per_entry, (size_t)z->repeat);
  bench_stats over = bench_stats_of(z->overhead_per_entry, (size_t)z->repeat);
  bench_stats map = bench_stats_of(z->map_bytes_per_entry, (size_t)z->repeat);
  bench_stats peak = FIELD(VARIANT_STATE, hwm_bytes);
  bench_stats peak_cp = FIELD(VARIANT_CHECKPOINT, hwm_bytes);
  bench_stats anon_cp = FIELD(VARIANT_CHECKPOINT, anon_peak_bytes);
  bench_stats map_cp = FIELD(VARIANT_CHECKPOINT, map_peak_bytes);
  bench_stats extra = bench_stats_of(z->checkpoint_extra_per_entry,
                                     (size_t)z->repeat);
  printf("%8" PRIu64 "  %7.1f %7.1f  %5.1f [%5.1f-%5.1f] %6.1f  %6.1f  "
         "%7.1f  %7.1f %7.1f %7.1f  %6.1f\n",
         z->keys, rss.median / mib, base.median / mib, per.median, per.min,
         per.max, over.median, map.median, peak.median / mib,
         peak_cp.median / mib, anon_cp.median / mib, map_cp.median / mib,
         extra.median);
  fflush(stdout);
}

static void json_size(bench_json *json, const size_runs *z) {
  size_t n = (size_t)z->repeat;
  bench_json_begin_object(json, 0);
  bench_json_u64(json, "keys", z->keys);
  bench_json_u64(json, "records", 2 * z->keys);
  bench_json_u64(json, "key_bytes", KEY_BYTES);
  bench_json_u64(json, "value_bytes", VALUE_BYTES);
  bench_json_stats(json, "rss_bytes", FIELD(VARIANT_STATE, rss_end_bytes));
  bench_json_stats(json, "rss_before_bytes",
                   FIELD(VARIANT_STATE, rss_before_bytes));
  bench_json_stats(json, "baseline_rss_bytes",
                   FIELD(VARIANT_BASELINE, rss_end_bytes));
  bench_json_stats(json, "baseline_rss_before_bytes",
                   FIELD(VARIANT_BASELINE, rss_before_bytes));
  bench_json_stats(json, "bytes_per_entry",
                   bench_stats_of(z->bytes_per_entry, n));
  bench_json_stats(json, "overhead_per_entry",
                   bench_stats_of(z->overhead_per_entry, n));
  bench_json_stats(json, "map_bytes_per_entry",
                   bench_stats_of(z->map_bytes_per_entry, n));
  bench_json_stats(json, "peak_rss_bytes", FIELD(VARIANT_STATE, hwm_bytes));
  bench_json_stats(json, "peak_rss_maxrss_bytes",
                   FIELD(VARIANT_STATE, maxrss_bytes));
  bench_json_stats(json, "peak_rss_with_checkpoint_bytes",
                   FIELD(VARIANT_CHECKPOINT, hwm_bytes));
  bench_json_stats(json, "peak_anon_rss_with_checkpoint_bytes",
                   FIELD(VARIANT_CHECKPOINT, anon_peak_bytes));
  bench_json_stats(json, "peak_anon_rss_bytes",
                   FIELD(VARIANT_STATE, anon_peak_bytes));
  bench_json_stats(json, "map_peak_bytes_with_checkpoint",
                   FIELD(VARIANT_CHECKPOINT, map_peak_bytes));
  bench_json_stats(json, "checkpoint_extra_peak_bytes_per_entry",
                   bench_stats_of(z->checkpoint_extra_per_entry, n));
  bench_json_stats(json, "checkpoints_completed",
                   FIELD(VARIANT_CHECKPOINT, checkpoints));
  bench_json_stats(json, "state_run_us", FIELD(VARIANT_STATE, wall_us));
  bench_json_stats(json, "checkpoint_run_us",
                   FIELD(VARIANT_CHECKPOINT, wall_us));
  json_checkpoint_memory(json, z);
  bench_json_end_object(json);
}
#undef FIELD

static void print_header(bool quick, int repeat) {
  printf("Memory of keyed state: one 8-byte value per 8-byte key "
         "(sl_state_update), 2 passes over the keys, fresh process per run; "
         "median of %d%s\n", repeat, quick ? " (quick)" : "");
  printf("%8s  %7s %7s  %-19s %6s  %6s  %7s  %7s %7s %7s  %6s\n", "keys",
         "RSS", "base", "B/entry [min-max]", "ovh", "map B", "peak",
         "peak+cp", "anon+cp", "map+cp", "cp B/e");
  printf("%8s  %7s %7s  %-19s %6s  %6s  %7s  %7s %7s %7s  %6s\n", "",
         "MiB", "MiB", "", "B", "/entry", "MiB", "MiB", "MiB", "MiB", "");
}

/* Write the results to path.  Returns 0, or 1 after printing why. */
static int write_json(const char *path, bool quick, int repeat,
                      const size_runs sizes[2], bench_stats largest,
                      bool met) {
  bench_json json;
  if (bench_json_open(&json, path) != 0)
    return perror(path), 1;
  bench_json_begin_object(&json, 0);
  bench_json_string(&json, "benchmark", "memory_bench");
  bench_json_machine(&json);
  bench_json_bool(&json, "quick", quick);
  bench_json_u64(&json, "repeat", (uint64_t)repeat);
  bench_json_u64(&json, "baseline_keys", BASELINE_KEYS);
  bench_json_begin_array(&json, "sizes");
  for (int i = 0; i < 2; i++)
    json_size(&json, &sizes[i]);
  bench_json_end_array(&json);
  bench_json_begin_object(&json, "target");
  bench_json_double(&json, "overhead_per_entry_max", TARGET_OVERHEAD_BYTES);
  bench_json_double(&json, "measured_at_largest", largest.median);
  bench_json_bool(&json, "met", met);
  bench_json_end_object(&json);
  return bench_json_finish(&json, "memory_bench", path) == 0 ? 0 : 1;
}

static int usage(void) {
  fprintf(stderr, "usage: memory_bench [--quick] [--repeat R] "
                  "[--json PATH]\n");
  return 2;
}

int main(int argc, char **argv) {
  sl_log_set_handler(sl_log_stderr, NULL); /* the library is silent unless asked */
  if (argc == 4 && strcmp(argv[1], "--child") == 0)
    return child_main(atoi(argv[2]), strtoull(argv[3], 0, 10));
  bool quick = false;
  int repeat = 0;
  const char *json_path = "bench/results/memory_bench.json";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : 0;
    int used = bench_run_option(a, v, &quick, &repeat, 0, &json_path, 0);
    if (!used)
      return usage();
    i += used - 1;
  }
  repeat = repeat ? repeat : quick ? 1 : 3;
  if (repeat < 1 || repeat > MAX_REPEAT)
    return fprintf(stderr, "memory_bench: --repeat 1..%d\n", MAX_REPEAT), 2;
  if (bench_self_path(self_path, sizeof self_path) != 0)
    return fprintf(stderr, "memory_bench: cannot name this program\n"), 1;
  static size_runs sizes[2];
  sizes[0] = (size_runs){.keys = quick ? 100000u : 1000000u, .repeat = repeat};
  sizes[1] = (size_runs){.keys = quick ? 1000000u : 10000000u,
                         .repeat = repeat};
  print_header(quick, repeat);
  for (int i = 0; i < 2; i++) {
    if (run_size(&sizes[i]) != 0)
      return 1;
    print_size(&sizes[i]);
  }
  for (int i = 0; i < 2; i++)
    print_checkpoint_memory(&sizes[i]);
  bench_stats largest = bench_stats_of(sizes[1].overhead_per_entry,
                                       (size_t)repeat);
  bool met = largest.median <= TARGET_OVERHEAD_BYTES;
  printf("RSS: at the end with the state alive; base: the same records over "
         "%u keys; B/entry: RSS growth over base / keys; ovh: B/entry - 16; "
         "map B: the map's own accounting; peak: VmHWM; +cp: the run with a "
         "checkpoint between the passes (anon: sampled RssAnon; map: the "
         "map's peak); cp B/e: (peak+cp - peak) / keys\n", BASELINE_KEYS);
  printf("target: overhead <= %.0f bytes per entry at %" PRIu64 " keys: "
         "%.1f, %s\n", TARGET_OVERHEAD_BYTES, sizes[1].keys, largest.median,
         met ? "met" : "MISSED");
  return write_json(json_path, quick, repeat, sizes, largest, met);
}
