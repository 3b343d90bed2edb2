/* test_push_positions.c — the push source with positions (issue 19):
 *
 * - a resume from a state directory answers sl_push_resume_position() with
 *   the checkpointed position + 1 and drops what is pushed at or below it;
 * - the numbered form continues its numbers after a resume;
 * - an in-process failover (an injected fault, a restart strategy) loses
 *   and duplicates nothing at a verifying sink, in both forms, also with a
 *   replay log small enough to fill;
 * - a try-push gets EAGAIN, poll() on sl_push_fd() wakes when room
 *   appears, and the next try succeeds; sl_push_items() with
 *   SL_PUSH_NONBLOCK stops at a full queue and says how many went in;
 * - a job failed by a callback returning 42 makes a waiting pusher, a
 *   poller and sl_push_resume_position() return 42;
 * - a child process pushing with positions into an exactly-once file sink
 *   is killed with SIGKILL; the parent resumes from its state directory
 *   and pushes everything again: the committed files hold every record
 *   once;
 * - the forms cannot be mixed, positions must increase.
 *
 * Every job uses real LMDB state directories and threads; checkpoints are
 * triggered by the test (the periodic interval is an hour) or, in the
 * failover tests, periodic; nothing waits by sleeping for a fixed time.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sluice.h"
#include "sluice_checkpoint.h"
#include "sluice_io.h"
#include "sluice_testing.h"
#include "test_dirs.h"
#include "test_util.h"

/* A checkpoint interval no test reaches: checkpoints come from triggers. */
#define NEVER_MS 3600000u

/* ------------------------------------------------------------ helpers */

/* Wait up to 60 s for cond(arg); false if it never held.  Polls every
 * 200 us: a wait for a condition, not a delay. */
static bool wait_for(bool (*cond)(void *), void *arg) {
  double deadline = sl_test_now_s() + 60.0;
  while (!cond(arg)) {
    if (sl_test_now_s() > deadline)
      return false;
    sl_test_sleep_us(200);
  }
  return true;
}

typedef struct checkpoint_wait {
  sl_job *job;
  uint64_t id;
} checkpoint_wait;

static bool checkpoint_done(void *arg) {
  checkpoint_wait *w = arg;
  return sl_job_last_checkpoint(w->job, 0) >= w->id;
}

/* Trigger a checkpoint and wait until it (or a later one) is complete. */
static uint64_t checkpoint_now(sl_job *job) {
  checkpoint_wait w = {.job = job};
  int rc = EBUSY;
  for (int tries = 0; tries < 60000 && rc == EBUSY; tries++) {
    rc = sl_job_trigger_checkpoint(job, &w.id);
    if (rc == EBUSY)
      sl_test_sleep_us(1000); /* one in flight: wait for its end */
  }
  cr_assert_eq(rc, 0, "trigger: %s", sl_strerror(rc));
  cr_assert(wait_for(checkpoint_done, &w), "checkpoint %" PRIu64
            " never completed: %s", w.id, sl_job_error(job));
  return w.id;
}

/* Run a started job to its end under a watchdog; returns its result. */
static int wait_guarded(sl_job *job, const char *what) {
  sl_test_watchdog w;
  cr_assert_eq(sl_test_watchdog_arm(&w, job, 120, what), 0);
  int rc = sl_job_wait(job);
  cr_assert_not(sl_test_watchdog_disarm(&w), "%s hung", what);
  return rc;
}

/* ------------------------------------------------------------ collector */

/* A callback sink's memory: the value of each sl_tuple received, in order.
 * With gate set, the first record waits until the test opens it, then
 * the sink returns fail_status (if not 0). */
typedef struct collector {
  pthread_mutex_t lock;
  pthread_cond_t opened;
  bool gate;
  int fail_status;
  uint64_t *values; /* sink thread only until the job ended */
  size_t capacity;
  _Atomic uint64_t received;
} collector;

static void collector_init(collector *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->lock, 0);
  pthread_cond_init(&c->opened, 0);
  atomic_init(&c->received, 0);
}

static void collector_free(collector *c) {
  pthread_cond_destroy(&c->opened);
  pthread_mutex_destroy(&c->lock);
  free(c->values);
}

static void collector_open_gate(collector *c) {
  pthread_mutex_lock(&c->lock);
  c->gate = false;
  pthread_cond_broadcast(&c->opened);
  pthread_mutex_unlock(&c->lock);
}

static int collect(void *user, int instance, const sl_record *rec) {
  (void)instance;
  collector *c = user;
  pthread_mutex_lock(&c->lock);
  while (c->gate)
    pthread_cond_wait(&c->opened, &c->lock);
  pthread_mutex_unlock(&c->lock);
  if (c->fail_status)
    return c->fail_status;
  if (rec->size_bytes != sizeof(sl_tuple))
    return -EPROTO;
  sl_tuple t;
  memcpy(&t, rec->data, sizeof t);
  uint64_t n = atomic_load(&c->received);
  if (n == c->capacity) {
    size_t grown = c->capacity ? c->capacity * 2 : 1024;
    uint64_t *v = realloc(c->values, grown * sizeof *v);
    if (!v)
      return -ENOMEM;
    c->values = v;
    c->capacity = grown;
  }
  c->values[n] = t.value;
  atomic_store(&c->received, n + 1);
  return 0;
}

typedef struct count_wait {
  collector *c;
  uint64_t count;
} count_wait;

static bool received_enough(void *arg) {
  count_wait *w = arg;
  return atomic_load(&w->c->received) >= w->count;
}

static void wait_received(collector *c, uint64_t count) {
  count_wait w = {c, count};
  cr_assert(wait_for(received_enough, &w), "the sink got %" PRIu64
            " of %" PRIu64 " records", atomic_load(&c->received), count);
}

/* push source "push" -> callback sink "sink" collecting into c. */
static sl_job *collect_job(const sl_job_config *config, uint32_t capacity,
                           collector *c, sl_push **push) {
  sl_job *job;
  cr_assert_eq(sl_job_create(config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_push(job, "push", capacity, &src, push), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_sink_callback(job, "sink", src, 1, collect, c, &sink), 0);
  return job;
}

static sl_job_config resume_config(const char *dir) {
  sl_job_config config = sl_fixture_config(dir, NEVER_MS);
  config.checkpoint.store_policy = SL_STORE_RESUME;
  return config;
}

static int push_at(sl_push *p, uint64_t position) {
  sl_tuple t = {0, position};
  return sl_push_record_at(p, position, &t, sizeof t, SL_NO_TIMESTAMP);
}

/* ------------------------------------------------------------ resume */

/* Run 1 pushes positions 0, 10, 20 .. 10*(K-1), checkpoints once all were
 * emitted, pushes K more and is stopped.  Run 2 resumes: the next
 * position is 10*(K-1) + 1, pushing everything again drops the
 * checkpointed K, and the sink gets exactly the rest. */
Test(positions, a_resume_gives_the_next_position_and_drops_at_or_below) {
  char *dir = sl_test_temp_dir("pushpos");
  sl_job_config config = resume_config(dir);
  const uint64_t k = 500;
  collector c;
  collector_init(&c);
  sl_push *push;
  sl_job *job = collect_job(&config, 0, &c, &push);
  cr_assert_eq(sl_push_resume_position(push, &(uint64_t){0}), SL_ENOTSTARTED);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t next = 99;
  cr_assert_eq(sl_push_resume_position(push, &next), 0);
  cr_assert_eq(next, 0, "a fresh start begins at 0");
  for (uint64_t i = 0; i < k; i++)
    cr_assert_eq(push_at(push, 10 * i), 0);
  wait_received(&c, k); /* all emitted before the barrier */
  checkpoint_now(job);
  for (uint64_t i = k; i < 2 * k; i++)
    cr_assert_eq(push_at(push, 10 * i), 0);
  wait_received(&c, 2 * k);
  sl_job_stop(job);
  cr_assert_eq(wait_guarded(job, "run 1"), SL_ESTOPPED);
  cr_assert_eq(sl_push_dropped(push), 0);
  sl_job_destroy(job);
  collector_free(&c);

  collector_init(&c);
  job = collect_job(&config, 0, &c, &push);
  for (uint64_t i = 0; i < 3; i++) /* before the start: queued, then dropped */
    cr_assert_eq(push_at(push, 10 * i), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_push_resume_position(push, &next), 0);
  cr_assert_eq(next, 10 * (k - 1) + 1, "next %" PRIu64, next);
  for (uint64_t i = 3; i < 3 * k; i++) /* from 30 on: the app re-pushes */
    cr_assert_eq(push_at(push, 10 * i), 0);
  sl_push_close(push);
  cr_assert_eq(wait_guarded(job, "run 2"), 0, "%s", sl_job_error(job));
  cr_assert_eq(sl_push_dropped(push), k, "dropped %" PRIu64,
               sl_push_dropped(push));
  cr_assert_eq(atomic_load(&c.received), 2 * k);
  for (uint64_t i = 0; i < 2 * k; i++)
    cr_assert_eq(c.values[i], 10 * (k + i), "record %" PRIu64, i);
  sl_job_destroy(job);
  collector_free(&c);
  sl_test_remove_tree(dir);
}

/* One run of the numbered form: resume, check the next number, push
 * count records, checkpoint once they were emitted, stop. */
static void numbered_run(const char *dir, uint64_t expect_next,
                         uint64_t count) {
  sl_job_config config = resume_config(dir);
  collector c;
  collector_init(&c);
  sl_push *push;
  sl_job *job = collect_job(&config, 0, &c, &push);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t next = UINT64_MAX;
  cr_assert_eq(sl_push_resume_position(push, &next), 0);
  cr_assert_eq(next, expect_next, "next %" PRIu64 ", expected %" PRIu64,
               next, expect_next);
  for (uint64_t i = 0; i < count; i++) {
    sl_tuple t = {0, i};
    cr_assert_eq(sl_push_record(push, &t, sizeof t, SL_NO_TIMESTAMP), 0);
  }
  cr_assert_eq(push_at(push, 5), SL_EUSAGE, "the numbered form is fixed");
  wait_received(&c, count);
  checkpoint_now(job);
  sl_job_stop(job);
  cr_assert_eq(wait_guarded(job, "numbered run"), SL_ESTOPPED);
  cr_assert_eq(sl_push_dropped(push), 0, "numbered records are not dropped");
  sl_job_destroy(job);
  collector_free(&c);
}

Test(positions, the_numbered_form_continues_after_a_resume) {
  char *dir = sl_test_temp_dir("pushnum");
  numbered_run(dir, 0, 300);
  numbered_run(dir, 300, 200);
  numbered_run(dir, 500, 1);
  sl_test_remove_tree(dir);
}

/* ------------------------------------------------------------ failover */

typedef struct feeder {
  pthread_t thread;
  sl_push *push;
  uint64_t count;
  bool positioned;
  int rc;
} feeder;

/* Push sl_tuple {0, i} for i = 0 .. count-1 (at position 3*i when
 * positioned: gaps are the application's business), then close. */
static void *feeder_main(void *arg) {
  feeder *f = arg;
  for (uint64_t i = 0; i < f->count && f->rc == 0; i++) {
    sl_tuple t = {0, i};
    f->rc = f->positioned
                ? sl_push_record_at(f->push, 3 * i, &t, sizeof t,
                                    SL_NO_TIMESTAMP)
                : sl_push_record(f->push, &t, sizeof t, SL_NO_TIMESTAMP);
  }
  sl_push_close(f->push);
  return 0;
}

/* push -> verifying sink (key 0, values 0 .. count-1 in order) with a
 * restart strategy, checkpoints every 5 ms and faults. */
static void failover_run(bool positioned, uint32_t replay_records,
                         const char *faults, uint32_t restarts) {
  char *dir = sl_test_temp_dir("pushfo");
  uint64_t count = sl_test_scaled(200000, 20000);
  sl_job_config config = sl_fixture_config(dir, 5);
  config.restart = sl_restart_defaults(SL_RESTART_FIXED_DELAY);
  config.restart.attempts = restarts;
  config.restart.delay_ms = 0;
  config.faults = faults;
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *verify;
  sl_push *push;
  cr_assert_eq(sl_source_push(job, "push", 256, &src, &push), 0);
  if (replay_records)
    cr_assert_eq(sl_push_set_replay_capacity(push, replay_records), 0);
  cr_assert_eq(sl_sink_verify(job, "verify", src, 1, count, 1, &verify), 0);
  feeder f = {.push = push, .count = count, .positioned = positioned};
  cr_assert_eq(pthread_create(&f.thread, 0, feeder_main, &f), 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  int rc = wait_guarded(job, "push failover");
  pthread_join(f.thread, 0);
  cr_assert_eq(rc, 0, "%s: %s", sl_strerror(rc), sl_job_error(job));
  cr_assert_eq(f.rc, 0, "pusher: %s", sl_strerror(f.rc));
  cr_assert_eq(sl_job_restarts(job), restarts, "%" PRIu32 " restarts",
               sl_job_restarts(job));
  sl_verify_counts v;
  cr_assert_eq(sl_verify_result(verify, &v), 0);
  cr_assert(v.complete);
  cr_assert_eq(v.lost, 0, "%" PRIu64 " lost", v.lost);
  cr_assert_eq(v.duplicates, 0, "%" PRIu64 " duplicated", v.duplicates);
  cr_assert_eq(v.out_of_order, 0, "%" PRIu64 " out of order", v.out_of_order);
  cr_assert_eq(v.in_order, count);
  cr_assert_eq(sl_push_dropped(push), 0);
  sl_job_destroy(job);
  sl_test_remove_tree(dir);
}

Test(positions, an_in_process_failover_loses_and_duplicates_nothing) {
  /* The sink fails at its 5000th and, after the first restart, again at
   * its 9000th record: records emitted since the last checkpoint are in
   * flight both times. */
  failover_run(true, 0, "fail:op=verify,record=5000,times=2", 2);
  failover_run(false, 0, "fail:op=verify,record=5000,times=2", 2);
  /* The source itself fails after emitting its 7000th record. */
  failover_run(true, 0, "fail:op=push,record=7000,times=1", 1);
}

/* Counts the WARN lines that say a replay log is full (one per stall). */
static atomic_int log_full_warnings;

static void count_log_full(void *user, int level, const char *message) {
  (void)user;
  if (level == SL_LOG_WARN && strstr(message, "replay log is full"))
    atomic_fetch_add(&log_full_warnings, 1);
}

Test(positions, a_full_replay_log_holds_the_source_until_a_checkpoint) {
  atomic_store(&log_full_warnings, 0);
  sl_log_set_handler(count_log_full, 0);
  /* 1024 records: at this push rate the log fills between checkpoints (5
   * ms apart) again and again. */
  failover_run(true, 1024, "fail:op=verify,record=3000,times=1", 1);
  sl_log_set_handler(0, 0);
  cr_assert_gt(atomic_load(&log_full_warnings), 0, "a stall is reported");
}

/* ------------------------------------------------------------ non-blocking */

static void wait_readable(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  int n = poll(&pfd, 1, 60000); /* a bound, not a synchronisation */
  cr_assert_eq(n, 1, "the eventfd never became readable");
  uint64_t counter;
  cr_assert_eq(read(fd, &counter, sizeof counter), (ssize_t)sizeof counter);
  cr_assert_gt(counter, 0);
}

static bool readable_now(int fd) {
  struct pollfd pfd = {.fd = fd, .events = POLLIN};
  return poll(&pfd, 1, 0) == 1;
}

Test(nonblocking, a_try_push_gets_eagain_then_poll_then_success) {
  collector c;
  collector_init(&c);
  sl_push *push;
  sl_job *job = collect_job(NULL, 4, &c, &push);
  int fd = sl_push_fd(push);
  cr_assert_geq(fd, 0, "%s", strerror(-fd));
  cr_assert_eq(sl_push_fd(push), fd, "one descriptor per handle");
  for (uint64_t i = 0; i < 4; i++) /* before the start: fills the queue */
    cr_assert_eq(sl_push_try_record_at(push, i, &(sl_tuple){0, i},
                                       sizeof(sl_tuple), SL_NO_TIMESTAMP), 0);
  cr_assert_eq(sl_push_try_record_at(push, 4, &(sl_tuple){0, 4},
                                     sizeof(sl_tuple), SL_NO_TIMESTAMP),
               EAGAIN);
  cr_assert_not(readable_now(fd), "no room yet");
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_readable(fd); /* the source took the queue */
  cr_assert_eq(sl_push_try_record_at(push, 4, &(sl_tuple){0, 4},
                                     sizeof(sl_tuple), SL_NO_TIMESTAMP), 0);
  sl_push_close(push);
  cr_assert_eq(wait_guarded(job, "try push"), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.received), 5);
  for (uint64_t i = 0; i < 5; i++)
    cr_assert_eq(c.values[i], i);
  /* Closed: a poller wakes, and its try gets SL_EUSAGE. */
  cr_assert(readable_now(fd));
  cr_assert_eq(sl_push_try_record(push, &(sl_tuple){0, 9}, sizeof(sl_tuple),
                                  SL_NO_TIMESTAMP), SL_EUSAGE);
  sl_job_destroy(job); /* closes fd */
  collector_free(&c);
}

/* Items of different sizes: the first sl_push_items() with NONBLOCK fills
 * the queue of 8 and says so; after the poll the rest go in, in order. */
static int check_sizes(void *user, int instance, const sl_record *rec) {
  (void)instance;
  uint64_t *seen = user; /* [0]: records; [1]: a mismatch (1 + index) */
  uint64_t i = seen[0]++;
  if (rec->size_bytes != 8 + 8 * (i % 5))
    seen[1] = 1 + i;
  for (uint32_t b = 0; b < rec->size_bytes; b++)
    if (((const uint8_t *)rec->data)[b] != (uint8_t)(i + b))
      seen[1] = 1 + i;
  return 0;
}

Test(nonblocking, push_items_with_nonblock_stops_at_a_full_queue) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *src, *sink;
  sl_push *push;
  cr_assert_eq(sl_source_push(job, "push", 8, &src, &push), 0);
  uint64_t seen[2] = {0, 0};
  cr_assert_eq(sl_sink_callback(job, "sink", src, 1, check_sizes, seen,
                                &sink), 0);
  enum { ITEMS = 12 };
  static uint8_t bytes[ITEMS][48];
  sl_push_item items[ITEMS];
  for (uint32_t i = 0; i < ITEMS; i++) {
    for (uint32_t b = 0; b < 48; b++)
      bytes[i][b] = (uint8_t)(i + b);
    items[i] = (sl_push_item){bytes[i], 8 + 8 * (i % 5), SL_NO_TIMESTAMP,
                              100 + 2 * i};
  }
  int fd = sl_push_fd(push);
  cr_assert_geq(fd, 0);
  uint32_t pushed = 99;
  cr_assert_eq(sl_push_items(push, items, ITEMS,
                             SL_PUSH_NONBLOCK | SL_PUSH_POSITIONED, &pushed),
               EAGAIN);
  cr_assert_eq(pushed, 8);
  cr_assert_eq(sl_push_items(push, items, 1, 4, &pushed), EINVAL, "a flag");
  cr_assert_eq(sl_push_record(push, bytes[0], 8, 0), SL_EUSAGE,
               "positions were fixed by the first items");
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  wait_readable(fd);
  cr_assert_eq(sl_push_items(push, items + 8, ITEMS - 8, SL_PUSH_NONBLOCK,
                             &pushed), 0);
  cr_assert_eq(pushed, ITEMS - 8);
  cr_assert_eq(sl_push_items(push, items, 1, 0, &pushed), EINVAL,
               "position 100 is not above 122");
  cr_assert_eq(pushed, 0);
  sl_push_close(push);
  cr_assert_eq(wait_guarded(job, "push items"), 0, "%s", sl_job_error(job));
  cr_assert_eq(seen[0], ITEMS);
  cr_assert_eq(seen[1], 0, "record %" PRIu64 " differs", seen[1] - 1);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ failures */

typedef struct blocked_pusher {
  pthread_t thread;
  sl_push *push;
  uint64_t pushed;
  int rc;
} blocked_pusher;

/* Pushes until refused: the gated sink takes one record, so this thread
 * ends up waiting for room whatever the scheduling. */
static void *blocked_pusher_main(void *arg) {
  blocked_pusher *b = arg;
  for (uint64_t i = 0; b->rc == 0 && i < 100000000; i++) {
    b->rc = push_at(b->push, i);
    b->pushed += b->rc == 0;
  }
  return 0;
}

Test(failures, a_callback_failure_gives_waiting_pushers_its_status) {
  collector c;
  collector_init(&c);
  c.gate = true;
  c.fail_status = 42;
  sl_job_config config = {.struct_bytes = sizeof(sl_job_config),
                          .ring_bytes = 4096};
  sl_push *push;
  sl_job *job = collect_job(&config, 16, &c, &push);
  int fd = sl_push_fd(push);
  cr_assert_geq(fd, 0);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  blocked_pusher b = {.push = push};
  cr_assert_eq(pthread_create(&b.thread, 0, blocked_pusher_main, &b), 0);
  collector_open_gate(&c); /* the sink returns 42 on its first record */
  pthread_join(b.thread, 0);
  cr_assert_eq(b.rc, 42, "the pusher got %d (%s)", b.rc, sl_strerror(b.rc));
  cr_assert_gt(b.pushed, 0);
  wait_readable(fd); /* a poller wakes too */
  cr_assert_eq(sl_push_try_record_at(push, b.pushed + 1, &(sl_tuple){0, 0},
                                     sizeof(sl_tuple), SL_NO_TIMESTAMP), 42);
  cr_assert_eq(wait_guarded(job, "failed job"), 42);
  cr_assert(strstr(sl_job_error(job), "callback returned 42"), "%s",
            sl_job_error(job));
  cr_assert_eq(push_at(push, UINT64_MAX - 1), 42, "after sl_job_wait too");
  sl_job_destroy(job);
  collector_free(&c);
}

/* A job that fails before its source restored: sl_push_resume_position
 * gives the failure's status.  The open of the sink fails at once. */
static int fail_open(sl_ctx *ctx, void *user, void **state) {
  (void)user;
  (void)state;
  sl_ctx_fail(ctx, "refused to open");
  return 42;
}

static int never_called(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  (void)ctx, (void)state, (void)input, (void)in;
  return -EPROTO;
}

Test(failures, resume_position_of_a_job_that_failed_early) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *src, *sink;
  sl_push *push;
  cr_assert_eq(sl_source_push(job, "push", 0, &src, &push), 0);
  static const sl_process_ops ops = {.open = fail_open,
                                     .process = never_called};
  cr_assert_eq(sl_op_sink(job, "sink", src, 1, &ops, 0, &sink), 0);
  cr_assert_eq(sl_job_start(job), 0);
  uint64_t next = 7;
  int rc = sl_push_resume_position(push, &next);
  /* The source may have decided (0) before the sink's open failed. */
  cr_assert(rc == 42 || (rc == 0 && next == 0), "%d (%s)", rc,
            sl_strerror(rc));
  cr_assert_eq(wait_guarded(job, "failed open"), 42);
  cr_assert_eq(push_at(push, 1), 42);
  sl_job_destroy(job);
}

/* ------------------------------------------------------------ usage */

Test(positions, forms_cannot_be_mixed_and_positions_must_increase) {
  sl_job *job;
  cr_assert_eq(sl_job_create(NULL, &job), 0);
  sl_op *src, *sink;
  sl_push *push;
  cr_assert_eq(sl_source_push(job, "push", 0, &src, &push), 0);
  collector c;
  collector_init(&c);
  cr_assert_eq(sl_sink_callback(job, "sink", src, 1, collect, &c, &sink), 0);
  cr_assert_eq(push_at(push, 5), 0);
  cr_assert_eq(push_at(push, 5), EINVAL, "not above the last");
  cr_assert_eq(push_at(push, 4), EINVAL, "below the last");
  cr_assert_eq(push_at(push, UINT64_MAX), EINVAL, "reserved");
  sl_tuple t = {0, 0};
  cr_assert_eq(sl_push_record(push, &t, sizeof t, 0), SL_EUSAGE);
  cr_assert_eq(sl_push_batch(push, &t, sizeof t, 1, 0, 0), SL_EUSAGE);
  cr_assert_eq(sl_push_try_record(push, &t, sizeof t, 0), SL_EUSAGE);
  cr_assert_eq(push_at(push, 6), 0);
  cr_assert_eq(sl_push_resume_position(push, NULL), EINVAL);
  cr_assert_eq(sl_push_set_replay_capacity(push, (1u << 28) + 1), EINVAL);
  cr_assert_eq(sl_push_set_replay_capacity(push, 0), 0);
  cr_assert_eq(sl_push_fd(NULL), -EINVAL);
  cr_assert_eq(sl_push_dropped(NULL), 0);
  cr_assert_eq(sl_job_start(job), 0);
  cr_assert_eq(sl_push_set_replay_capacity(push, 10), SL_ESTARTED);
  sl_push_close(push);
  cr_assert_eq(wait_guarded(job, "usage"), 0, "%s", sl_job_error(job));
  cr_assert_eq(atomic_load(&c.received), 2);
  cr_assert_eq(c.values[0], 5);
  cr_assert_eq(c.values[1], 6);
  sl_job_destroy(job);
  collector_free(&c);
}

/* ------------------------------------------------------------ crash */

/* push (positions) -> exactly-once file sink, state in state_dir. */
static sl_job *file_job(const char *state_dir, const char *out_dir,
                        sl_push **push) {
  sl_job_config config = resume_config(state_dir);
  sl_job *job;
  cr_assert_eq(sl_job_create(&config, &job), 0);
  sl_op *src, *sink;
  cr_assert_eq(sl_source_push(job, "push", 1024, &src, push), 0);
  sl_file_sink_config out = {.dir = out_dir, .exactly_once = 1,
                             .format = sl_fixture_format_tuple};
  cr_assert_eq(sl_sink_file(job, "files", src, 1, &out, &sink), 0, "%s",
               sl_job_error(job));
  return job;
}

/* The child: push everything with positions, checkpointing on the way,
 * tell the parent ('c' after the first complete checkpoint, 'p' once all
 * was pushed), then wait to be killed.  Exit codes name what failed. */
static void crash_child(const char *state, const char *out, uint64_t count,
                        int report_fd) {
  sl_push *push;
  sl_job *job = file_job(state, out, &push);
  if (sl_job_start(job))
    _exit(10);
  for (uint64_t i = 0; i < count; i++) {
    if (push_at(push, i))
      _exit(11);
    if (i % 1000 == 999)
      sl_job_trigger_checkpoint(job, 0); /* EBUSY: one is in flight */
    if (i == count / 2) {
      checkpoint_wait w = {.job = job};
      if (sl_job_trigger_checkpoint(job, &w.id) == 0 &&
          !wait_for(checkpoint_done, &w))
        _exit(12);
      if (write(report_fd, "c", 1) != 1)
        _exit(13);
    }
  }
  if (write(report_fd, "p", 1) != 1)
    _exit(13);
  for (;;)
    pause(); /* SIGKILL ends it, output in flight */
}

Test(crash, a_killed_pusher_resumes_exactly_once_at_a_file_sink,
     .timeout = 300) {
  char *state = sl_test_temp_dir("pushkill"), *out = sl_test_temp_dir("pushkill");
  uint64_t count = sl_test_scaled(100000, 20000);
  int pipe_fds[2];
  cr_assert_eq(pipe(pipe_fds), 0);
  fflush(0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(pipe_fds[0]);
    crash_child(state, out, count, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  char got[2] = {0, 0};
  for (int k = 0; k < 2; k++)
    cr_assert_eq(read(pipe_fds[0], &got[k], 1), 1, "the child ended early");
  cr_assert(got[0] == 'c' && got[1] == 'p');
  close(pipe_fds[0]);
  cr_assert_eq(kill(pid, SIGKILL), 0);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "status %d", status);

  sl_push *push;
  sl_job *job = file_job(state, out, &push);
  cr_assert_eq(sl_job_start(job), 0, "%s", sl_job_error(job));
  uint64_t next;
  cr_assert_eq(sl_push_resume_position(push, &next), 0, "%s",
               sl_job_error(job));
  cr_assert_leq(next, count);
  for (uint64_t i = 0; i < count; i++) /* all again: the source drops */
    cr_assert_eq(push_at(push, i), 0);
  sl_push_close(push);
  cr_assert_eq(wait_guarded(job, "resumed file job"), 0, "%s",
               sl_job_error(job));
  cr_assert_eq(sl_push_dropped(push), next);
  sl_job_destroy(job);
  sl_verify_counts v;
  char err[256] = "";
  cr_assert_eq(sl_verify_output_dir(out, count, 1, &v, err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(v.records, count, "%" PRIu64 " records", v.records);
  cr_assert_eq(v.lost, 0);
  cr_assert_eq(v.duplicates, 0);
  cr_assert_eq(v.out_of_order, 0);
  cr_assert_eq(v.pending_files, 0);
  cr_log_info("killed after pushing %" PRIu64 "; resumed at %" PRIu64, count,
              next);
  sl_test_remove_tree(state);
  sl_test_remove_tree(out);
}
