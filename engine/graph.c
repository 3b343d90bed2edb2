/* graph.c — building, validating and compiling a job graph.
 *
 * The user builds a graph of operators; key_by and union are virtual (no
 * thread).  sl_job_compile() resolves the virtual operators into edges
 * between physical operators, then creates one ring per (producer instance,
 * consumer instance) pair of each edge (DESIGN.md invariant 1), the
 * instances, their input channels and their outputs.
 *
 * Every builder checks its arguments before it changes anything, so a
 * refused change leaves the graph as it was (Redis's adlist contract).
 */
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_abi.h"
#include "internal.h"
#include "cpus.h"
#include "log.h"
#include "utf8_check.h"

/* Automatic ring size: the job's rings share this much memory, each ring
 * between the two bounds.  On P1 (4 threads, 2 cores) 4 MiB rings ran about
 * 1.4x faster than 1 MiB ones in this machine's slower state: fewer context
 * switches.  Pages are touched only as rings fill. */
#define SL_RING_BUDGET_BYTES (256ull << 20)
#define SL_AUTO_RING_MIN_BYTES (512u << 10)
#define SL_AUTO_RING_MAX_BYTES (4u << 20)
#define SL_DEFAULT_MAX_RECORD_BYTES (64u << 10)
#define SL_DEFAULT_OUTPUT_BATCH 1024u
/* Also bounds how long a parked consumer can miss published batches when
 * its producer stays busy writing elsewhere (ring.h note 8). */
#define SL_DEFAULT_BUFFER_TIMEOUT_US 1000u
/* Spin iterations when threads outnumber the allowed CPUs: a spinning
 * thread then holds a core its producer may need, so it parks almost at
 * once (measured on P1, 2 cores, 4 threads: 5..20 spins about 1.2x faster
 * than 200, 2000 about 0.75x).  With a core per thread, spinning longer
 * saves the ~7 us futex wake per hop. */
#define SL_SPIN_OVERSUBSCRIBED 20u
#define SL_SPIN_DEDICATED 2000u
#define SL_DEFAULT_MAX_PARALLELISM 128u
#define SL_MAX_MAX_PARALLELISM 32768u
_Static_assert(SL_MAX_PARALLELISM <= UINT16_MAX,
               "group_instance tables hold instance indices in 16 bits");

void sl_job_set_error(sl_job *job, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(job->error, sizeof job->error, fmt, ap);
  va_end(ap);
}

static uint64_t round_up_pow2(uint64_t n) {
  uint64_t p = 1;
  while (p < n)
    p <<= 1;
  return p;
}

/* The job's name becomes a Prometheus label value, which the exposition
 * format requires to be UTF-8: a scraper refuses the whole page
 * otherwise.  EINVAL, with an ERROR line naming the field and the byte. */
static int name_utf8_check(const char *name) {
  size_t length = strlen(name); /* < SL_MAX_NAME, checked before */
  for (size_t i = 0; i < length;) {
    const char *why = "";
    size_t n = sl_utf8_sequence((const unsigned char *)name + i,
                                length - i, &why);
    if (n == 0) {
      sl_log(SL_LOG_ERROR,
             "sl_job_create: sl_job_config.name is not valid UTF-8: %s at "
             "byte %zu",
             why, i);
      return EINVAL;
    }
    i += n;
  }
  return 0;
}

/* The settings that do not depend on the ring size. */
static int config_resolve_rest(sl_job_config *c) {
  if (c->buffer_timeout_us == 0)
    c->buffer_timeout_us = SL_DEFAULT_BUFFER_TIMEOUT_US;
  if (c->output_batch_records == 0)
    c->output_batch_records = SL_DEFAULT_OUTPUT_BATCH;
  if (c->output_batch_records > SL_ENTRY_MAX_COUNT)
    return EINVAL;
  if (c->max_parallelism == 0)
    c->max_parallelism = SL_DEFAULT_MAX_PARALLELISM;
  if (c->max_parallelism > SL_MAX_MAX_PARALLELISM)
    return EINVAL;
  if (c->cpu_count < 0 || (c->cpu_count > 0 && !c->cpus))
    return EINVAL;
  if (c->pin_policy != SL_PIN_CHAINS && c->pin_policy != SL_PIN_ROUND_ROBIN)
    return EINVAL;
  if (c->chaining != SL_CHAINING_AUTO && c->chaining != SL_CHAINING_ALWAYS &&
      c->chaining != SL_CHAINING_NEVER) {
    sl_log(SL_LOG_ERROR, "sl_job_create: sl_job_config.chaining is %d; it "
           "takes SL_CHAINING_AUTO (0), SL_CHAINING_ALWAYS (1) or "
           "SL_CHAINING_NEVER (2)", c->chaining);
    return EINVAL;
  }
  if (c->checkpoint_copy_pass_bytes < SL_COPY_PASS_OFF) {
    sl_log(SL_LOG_ERROR, "sl_job_create: "
           "sl_job_config.checkpoint_copy_pass_bytes is %" PRId64 "; it "
           "takes 0 (the default limit), a positive number of bytes or "
           "SL_COPY_PASS_OFF (-1)", c->checkpoint_copy_pass_bytes);
    return EINVAL;
  }
  for (int i = 0; i < c->cpu_count; i++)
    if (c->cpus[i] < 0 || c->cpus[i] >= CPU_SETSIZE)
      return EINVAL;
  const struct sl_checkpoint_config *k = &c->checkpoint;
  if (k->max_concurrent > 16 || /* checkpoint_internal.h SL_MAX_CONCURRENT */
      (k->mode != SL_EXACTLY_ONCE && k->mode != SL_AT_LEAST_ONCE) ||
      (k->store_policy != SL_STORE_REFUSE &&
       k->store_policy != SL_STORE_RESUME && k->store_policy != SL_STORE_FRESH))
    return EINVAL;
  if (sl_restart_validate(&c->restart))
    return EINVAL;
  if (c->checkpoint_unaligned != 0 && c->checkpoint_unaligned != 1) {
    sl_log(SL_LOG_ERROR, "sl_job_create: sl_job_config.checkpoint_unaligned "
           "is %d, 0 or 1 expected", c->checkpoint_unaligned);
    return EINVAL;
  }
  if (c->checkpoint_unaligned && k->mode != SL_EXACTLY_ONCE) {
    sl_log(SL_LOG_ERROR, "sl_job_create: unaligned checkpoints need "
           "exactly-once mode (checkpoint.mode is SL_AT_LEAST_ONCE, which "
           "never blocks a channel: nothing to overtake)");
    return EINVAL;
  }
  if (c->checkpoint_aligned_timeout_ms && !c->checkpoint_unaligned) {
    sl_log(SL_LOG_ERROR, "sl_job_create: "
           "sl_job_config.checkpoint_aligned_timeout_ms is %" PRIu32
           " but checkpoint_unaligned is 0: the timeout switches a "
           "checkpoint to unaligned, so it needs unaligned checkpoints on",
           c->checkpoint_aligned_timeout_ms);
    return EINVAL;
  }
  if (k->state_dir && !k->state_dir[0])
    return EINVAL;
  if (k->from_savepoint && (!k->from_savepoint[0] || !k->state_dir))
    return EINVAL; /* a savepoint is copied into the state directory */
  if (c->name && (!c->name[0] || strnlen(c->name, SL_MAX_NAME) >= SL_MAX_NAME))
    return EINVAL; /* a label value of 1 .. SL_MAX_NAME-1 bytes */
  return c->name ? name_utf8_check(c->name) : 0;
}

/* Fill in defaults and check ranges.  Returns 0 or EINVAL. */
static int config_resolve(sl_job_config *c) {
  if (c->max_record_bytes == 0)
    c->max_record_bytes = SL_DEFAULT_MAX_RECORD_BYTES;
  if (c->ring_bytes == 0) /* automatic: sized in sl_job_compile */
    return c->max_record_bytes + 16ull > sl_ring_max_entry(SL_RING_MAX_BYTES)
               ? EINVAL
               : config_resolve_rest(c);
  if (c->ring_bytes < SL_RING_MIN_BYTES || c->ring_bytes > SL_RING_MAX_BYTES)
    return EINVAL;
  c->ring_bytes = round_up_pow2(c->ring_bytes);
  /* One entry (header, timestamp, payload) must fit in the largest entry a
   * ring takes (ring.h note 8). */
  if (c->max_record_bytes + 16ull > sl_ring_max_entry(c->ring_bytes)) {
    if (c->max_record_bytes != SL_DEFAULT_MAX_RECORD_BYTES)
      return EINVAL;
    c->max_record_bytes = (uint32_t)(sl_ring_max_entry(c->ring_bytes) - 16);
  }
  return config_resolve_rest(c);
}

SL_EXPORT int sl_job_create(const sl_job_config *config, sl_job **out) {
  *out = 0;
  if (sl_log_env_check() != 0) /* log.c note 4 */
    return EINVAL;
  sl_job *job = calloc(1, sizeof *job);
  if (!job)
    return ENOMEM;
  int rc = sl_job_config_read(config, &job->config); /* job.c note 3 */
  if (rc == 0)
    rc = config_resolve(&job->config);
  if (rc) {
    free(job);
    return rc;
  }
  if (job->config.cpu_count > 0) {
    job->cpus = malloc(sizeof(int) * (size_t)job->config.cpu_count);
    if (!job->cpus) {
      free(job);
      return ENOMEM;
    }
    memcpy(job->cpus, job->config.cpus,
           sizeof(int) * (size_t)job->config.cpu_count);
    job->config.cpus = job->cpus;
  }
  if (job->config.checkpoint.state_dir) { /* owned copy, like cpus */
    job->state_dir = strdup(job->config.checkpoint.state_dir);
    job->config.checkpoint.state_dir = job->state_dir;
  }
  if (job->config.faults) { /* the same */
    job->faults_text = strdup(job->config.faults);
    job->config.faults = job->faults_text;
  }
  if (job->config.checkpoint.from_savepoint) { /* the same */
    job->from_savepoint = strdup(job->config.checkpoint.from_savepoint);
    job->config.checkpoint.from_savepoint = job->from_savepoint;
  }
  /* Copied into the job (it has room): the caller's string may go. */
  snprintf(job->name, sizeof job->name, "%s",
           job->config.name ? job->config.name : "sluice");
  job->config.name = job->name;
  job->ops = calloc(SL_MAX_OPERATORS, sizeof *job->ops);
  if (!job->ops || (job->config.checkpoint.state_dir && !job->state_dir) ||
      (job->config.faults && !job->faults_text) ||
      (job->config.checkpoint.from_savepoint && !job->from_savepoint)) {
    free(job->ops);
    free(job->from_savepoint);
    free(job->faults_text);
    free(job->state_dir);
    free(job->cpus);
    free(job);
    return ENOMEM;
  }
  job->state = SL_JOB_BUILDING;
  *out = job;
  return 0;
}

/* ------------------------------------------------------------ builders */

static const char *kind_name(enum sl_op_kind k) {
  static const char *names[] = {"source",  "map",    "filter",
                                "flat_map", "process", "sink",
                                "key_by",  "union",  "side_output"};
  return names[k];
}

static sl_op *find_op(const sl_job *job, const char *name) {
  for (int i = 0; i < job->op_count; i++)
    if (strcmp(job->ops[i]->name, name) == 0)
      return job->ops[i];
  return 0;
}

/* Check that input may feed an operator named name of job. */
static int check_input(sl_job *job, const char *name, const sl_op *input) {
  if (!input) {
    sl_job_set_error(job, "operator '%s': input is NULL (dangling input)",
                     name);
    return SL_EGRAPH;
  }
  if (input->job != job) {
    sl_job_set_error(job,
                     "operator '%s': input '%s' belongs to another job",
                     name, input->name);
    return SL_EGRAPH;
  }
  if (input->kind == SL_OP_SINK) {
    sl_job_set_error(job,
                     "operator '%s': input '%s' is a sink, which has no "
                     "output",
                     name, input->name);
    return SL_EGRAPH;
  }
  return 0;
}

/* The builder's graph: operator i has id i and belongs to job; every input
 * is an earlier-made operator of the same job, never a sink; each input
 * link is counted once in its producer's consumer_count.  Asserted after
 * every change (op_new, sl_op_add_input) and when validation passes.
 * O(operators * inputs). */
static __attribute__((unused)) bool builder_check(const sl_job *job) {
  if (job->op_count < 0 || job->op_count > SL_MAX_OPERATORS)
    return false;
  long links = 0, consumers = 0;
  for (int i = 0; i < job->op_count; i++) {
    const sl_op *op = job->ops[i];
    if (!op || op->id != i || op->job != job)
      return false;
    if (op->input_count < 0 || op->input_count > SL_MAX_INPUTS)
      return false;
    if (sl_op_kind_is_virtual(op->kind) != (op->parallelism == 0))
      return false;
    if (op->port < 0 || op->port > SL_MAX_SIDE_OUTPUTS ||
        (op->kind != SL_OP_SIDE && op->port != 0))
      return false; /* a side output's port is set after op_new */
    for (int k = 0; k < op->input_count; k++) {
      const sl_op *in = op->inputs[k];
      if (!in || in->job != job || in->id < 0 || in->id >= job->op_count ||
          job->ops[in->id] != in || in->kind == SL_OP_SINK)
        return false;
    }
    links += op->input_count;
    consumers += op->consumer_count;
  }
  return links == consumers;
}

/* Create an operator after checking everything about it; on error nothing
 * is changed.  parallelism is 0 for virtual operators. */
static int op_new(sl_job *job, enum sl_op_kind kind, const char *name,
                  int parallelism, sl_op *const *inputs, int input_count,
                  sl_op **out) {
  if (out)
    *out = 0;
  if (!job)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (!out) {
    sl_job_set_error(job, "%s: the output pointer is NULL", kind_name(kind));
    return SL_EGRAPH;
  }
  if (!name || name[0] == 0 || strlen(name) >= SL_MAX_NAME) {
    sl_job_set_error(job,
                     "%s: operator name must have 1 to %d bytes, got %s",
                     kind_name(kind), SL_MAX_NAME - 1,
                     !name ? "NULL" : name[0] ? "a longer one" : "an empty one");
    return SL_EGRAPH;
  }
  if (find_op(job, name)) {
    sl_job_set_error(job, "%s '%s': an operator of that name exists",
                     kind_name(kind), name);
    return SL_EGRAPH;
  }
  if (!sl_op_kind_is_virtual(kind) &&
      (parallelism < 1 || parallelism > SL_MAX_PARALLELISM)) {
    sl_job_set_error(job, "%s '%s': parallelism %d is outside 1..%d",
                     kind_name(kind), name, parallelism, SL_MAX_PARALLELISM);
    return SL_EGRAPH;
  }
  if (input_count < 0 || input_count > SL_MAX_INPUTS ||
      (input_count > 0 && !inputs)) {
    sl_job_set_error(job, "%s '%s': %d inputs, allowed 0..%d",
                     kind_name(kind), name, input_count, SL_MAX_INPUTS);
    return SL_EGRAPH;
  }
  for (int i = 0; i < input_count; i++) {
    int rc = check_input(job, name, inputs[i]);
    if (rc)
      return rc;
  }
  if (job->op_count >= SL_MAX_OPERATORS) {
    sl_job_set_error(job, "%s '%s': the job already has %d operators",
                     kind_name(kind), name, SL_MAX_OPERATORS);
    return SL_EGRAPH;
  }
  sl_op *op = calloc(1, sizeof *op);
  if (!op)
    return ENOMEM;
  op->job = job;
  op->kind = kind;
  op->id = job->op_count;
  op->physical_index = -1;
  memcpy(op->name, name, strlen(name) + 1);
  op->parallelism = parallelism;
  for (int i = 0; i < input_count; i++) {
    op->inputs[i] = inputs[i];
    inputs[i]->consumer_count++;
  }
  op->input_count = input_count;
  job->ops[job->op_count++] = op;
  *out = op;
  assert(builder_check(job));
  return 0;
}

static int refuse(sl_job *job, const char *what, const char *name) {
  if (!job)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  sl_job_set_error(job, "operator '%s': %s", name ? name : "(null)", what);
  return SL_EGRAPH;
}

SL_EXPORT int sl_op_source(sl_job *job, const char *name, int parallelism,
                           const sl_source_ops *ops, void *user, sl_op **op) {
  if (!ops || !ops->next)
    return refuse(job, "source without a next callback", name);
  int rc = op_new(job, SL_OP_SOURCE, name, parallelism, 0, 0, op);
  if (rc)
    return rc;
  (*op)->fn.source = *ops;
  (*op)->user = user;
  return 0;
}

/* The part the one-input builders share: refuse a missing function (the
 * refusal says which), else make the operator with its user pointer; the
 * caller then stores the function.  On error nothing is changed. */
static int one_input_new(sl_job *job, enum sl_op_kind kind, const char *name,
                         sl_op *input, int parallelism, bool has_fn,
                         const char *missing_fn, void *user, sl_op **op) {
  if (!has_fn)
    return refuse(job, missing_fn, name);
  int rc = op_new(job, kind, name, parallelism, &input, 1, op);
  if (rc == 0)
    (*op)->user = user;
  return rc;
}

SL_EXPORT int sl_op_map(sl_job *job, const char *name, sl_op *input,
                        int parallelism, uint32_t out_max_bytes, sl_map_fn fn,
                        void *user, sl_op **op) {
  if (fn && job &&
      (out_max_bytes == 0 || out_max_bytes > job->config.max_record_bytes))
    return refuse(job, "map out_max_bytes must be 1..max_record_bytes", name);
  int rc = one_input_new(job, SL_OP_MAP, name, input, parallelism, fn != 0,
                         "map without a map function", user, op);
  if (rc)
    return rc;
  (*op)->fn.map = fn;
  (*op)->out_max_bytes = out_max_bytes;
  return 0;
}

SL_EXPORT int sl_op_filter(sl_job *job, const char *name, sl_op *input,
                           int parallelism, sl_filter_fn fn, void *user,
                           sl_op **op) {
  int rc = one_input_new(job, SL_OP_FILTER, name, input, parallelism, fn != 0,
                         "filter without a filter function", user, op);
  if (rc == 0)
    (*op)->fn.filter = fn;
  return rc;
}

SL_EXPORT int sl_op_flat_map(sl_job *job, const char *name, sl_op *input,
                             int parallelism, sl_flat_map_fn fn, void *user,
                             sl_op **op) {
  int rc = one_input_new(job, SL_OP_FLAT_MAP, name, input, parallelism,
                         fn != 0, "flat_map without a function", user, op);
  if (rc == 0)
    (*op)->fn.flat_map = fn;
  return rc;
}

SL_EXPORT int sl_op_key_by(sl_job *job, const char *name, sl_op *input,
                           sl_key_fn fn, void *user, sl_op **op) {
  int rc = one_input_new(job, SL_OP_KEY_BY, name, input, 0, fn != 0,
                         "key_by without a key function", user, op);
  if (rc == 0)
    (*op)->fn.key = fn;
  return rc;
}

SL_EXPORT int sl_op_union(sl_job *job, const char *name, sl_op *const *inputs,
                          int n_inputs, sl_op **op) {
  if (n_inputs < 1)
    return refuse(job, "union needs at least one input", name);
  return op_new(job, SL_OP_UNION, name, 0, inputs, n_inputs, op);
}

SL_EXPORT int sl_op_side_output(sl_job *job, const char *name, sl_op *op,
                                int port, sl_op **side) {
  if (op && (op->kind != SL_OP_PROCESS))
    return refuse(job, "a side output needs a process (or window) operator "
                       "as its input", name);
  if (port < 1 || port > SL_MAX_SIDE_OUTPUTS)
    return refuse(job, "side output port must be 1..SL_MAX_SIDE_OUTPUTS", name);
  int rc = op_new(job, SL_OP_SIDE, name, 0, &op, 1, side);
  if (rc)
    return rc;
  (*side)->port = port;
  return 0;
}

SL_EXPORT int sl_op_watermarks_sized(sl_op *source,
                                     const sl_watermark_config *config,
                                     size_t config_bytes) {
  if (!source || !config)
    return EINVAL;
  sl_job *job = source->job;
  sl_watermark_config copy;
  if (SL_CONFIG_READ(job, sl_op_watermarks, sl_watermark_config,
                     SL_WATERMARK_CONFIG_V1, config, config_bytes, &copy))
    return EINVAL;
  config = &copy;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (source->kind != SL_OP_SOURCE) {
    sl_job_set_error(job, "operator '%s': watermarks are generated at "
                     "sources, and it is a %s", source->name,
                     kind_name(source->kind));
    return EINVAL;
  }
  if (config->out_of_orderness < 0) {
    sl_job_set_error(job, "operator '%s': out_of_orderness %lld is negative",
                     source->name, (long long)config->out_of_orderness);
    return EINVAL;
  }
  source->watermarks = *config;
  if (source->watermarks.interval_ms == 0)
    source->watermarks.interval_ms = 200;
  source->has_watermarks = true;
  return 0;
}

static int process_new(sl_job *job, enum sl_op_kind kind, const char *name,
                       sl_op *const *inputs, int n_inputs, int parallelism,
                       const sl_process_ops *ops, void *user, sl_op **op) {
  if (!ops || !ops->process)
    return refuse(job, "process operator without a process callback", name);
  int rc = op_new(job, kind, name, parallelism, inputs, n_inputs, op);
  if (rc)
    return rc;
  (*op)->fn.process = *ops;
  (*op)->user = user;
  return 0;
}

SL_EXPORT int sl_op_process(sl_job *job, const char *name,
                            sl_op *const *inputs, int n_inputs,
                            int parallelism, const sl_process_ops *ops,
                            void *user, sl_op **op) {
  return process_new(job, SL_OP_PROCESS, name, inputs, n_inputs, parallelism,
                     ops, user, op);
}

SL_EXPORT int sl_op_sink(sl_job *job, const char *name, sl_op *input,
                         int parallelism, const sl_process_ops *ops,
                         void *user, sl_op **op) {
  return process_new(job, SL_OP_SINK, name, &input, 1, parallelism, ops, user,
                     op);
}

SL_EXPORT int sl_op_set_user_free(sl_op *op, void (*free_fn)(void *user)) {
  if (!op || !op->job)
    return EINVAL;
  /* A key_by, union or side output has no user pointer of its own. */
  if (sl_op_kind_is_virtual(op->kind))
    return EINVAL;
  if (op->user_free && free_fn)
    return SL_EUSAGE; /* a built-in already owns it */
  op->user_free = free_fn;
  return 0;
}

SL_EXPORT int sl_op_disable_chaining(sl_op *op) {
  if (!op || !op->job || sl_op_kind_is_virtual(op->kind))
    return EINVAL;
  if (atomic_load(&op->job->state) != SL_JOB_BUILDING)
    return SL_EUSAGE;
  op->no_chaining = true;
  return 0;
}

SL_EXPORT int sl_op_add_input(sl_job *job, sl_op *consumer, sl_op *input) {
  if (!job)
    return EINVAL;
  if (job->state != SL_JOB_BUILDING)
    return SL_ESTARTED;
  if (!consumer || consumer->job != job) {
    sl_job_set_error(job, "add_input: consumer is NULL or of another job");
    return SL_EGRAPH;
  }
  if (consumer->kind != SL_OP_PROCESS && consumer->kind != SL_OP_SINK &&
      consumer->kind != SL_OP_UNION) {
    sl_job_set_error(job,
                     "operator '%s': a %s takes no further inputs (only "
                     "process, sink and union do)",
                     consumer->name, kind_name(consumer->kind));
    return SL_EGRAPH;
  }
  if (consumer->kind == SL_OP_SINK && consumer->input_count >= 1) {
    sl_job_set_error(job,
                     "operator '%s': a sink has one input; union the streams "
                     "first",
                     consumer->name);
    return SL_EGRAPH;
  }
  int rc = check_input(job, consumer->name, input);
  if (rc)
    return rc;
  if (consumer->input_count >= SL_MAX_INPUTS) {
    sl_job_set_error(job, "operator '%s': already has %d inputs",
                     consumer->name, SL_MAX_INPUTS);
    return SL_EGRAPH;
  }
  consumer->inputs[consumer->input_count++] = input;
  input->consumer_count++;
  assert(builder_check(job));
  return 0;
}

/* ---------------------------------------------------------- validation */

enum { WHITE, GREY, BLACK };

/* Depth-first search over inputs; bounded by the operator count, since
 * every operator turns BLACK once.  Returns the operator that closes a
 * cycle, or NULL. */
static const sl_op *find_cycle(const sl_op *op, unsigned char *color) {
  color[op->id] = GREY;
  for (int i = 0; i < op->input_count; i++) {
    const sl_op *in = op->inputs[i];
    if (color[in->id] == GREY)
      return in;
    if (color[in->id] == WHITE) {
      const sl_op *c = find_cycle(in, color);
      if (c)
        return c;
    }
  }
  color[op->id] = BLACK;
  return 0;
}

/* The keys of the stream op, as its consumer sees them (the key_by nearest
 * it decides, as in resolve_edges): KEYS_NONE, KEYS_U64, KEYS_BYTES, or
 * KEYS_MIXED for a union of both kinds. */
enum { KEYS_NONE = 0, KEYS_U64 = 1, KEYS_BYTES = 2, KEYS_MIXED = 3 };

static int stream_keys(const sl_op *op) {
  if (op->kind == SL_OP_KEY_BY)
    return op->fn.key == sl_byte_key_route ? KEYS_BYTES : KEYS_U64;
  if (op->kind == SL_OP_SIDE)
    return stream_keys(op->inputs[0]);
  if (op->kind != SL_OP_UNION)
    return KEYS_NONE;
  int keys = KEYS_NONE;
  for (int i = 0; i < op->input_count; i++)
    keys |= stream_keys(op->inputs[i]);
  return keys;
}

/* An operator's keyed inputs are all byte-keyed or all 64-bit-keyed: its
 * keyed state has one layout (state.c). */
static int check_key_kinds(sl_job *job, const sl_op *op) {
  int keys = KEYS_NONE;
  for (int k = 0; k < op->input_count; k++)
    keys |= stream_keys(op->inputs[k]);
  if (keys != KEYS_MIXED)
    return 0;
  sl_job_set_error(job, "operator '%s': its inputs are keyed both by "
                   "sl_op_key_by (64-bit keys) and by sl_op_key_by_bytes "
                   "(byte strings); key every input the same way",
                   op->name);
  return SL_EGRAPH;
}

/* Is some physical operator reached through key_by/union from op with a
 * hash partition?  Used to check keyed parallelism. */
static bool reaches_through_key_by(const sl_op *op) {
  /* Recursion depth is bounded by the operator count: the graph has no
   * cycle when this runs. */
  if (op->kind == SL_OP_KEY_BY)
    return true;
  if (op->kind != SL_OP_UNION)
    return false;
  for (int i = 0; i < op->input_count; i++)
    if (reaches_through_key_by(op->inputs[i]))
      return true;
  return false;
}

SL_EXPORT int sl_job_validate(sl_job *job) {
  if (!job)
    return EINVAL;
  int sources = 0;
  for (int i = 0; i < job->op_count; i++)
    sources += job->ops[i]->kind == SL_OP_SOURCE;
  if (sources == 0) {
    sl_job_set_error(job, "the job has no source");
    return SL_EGRAPH;
  }
  unsigned char *color = calloc((size_t)job->op_count, 1);
  if (!color) {
    sl_job_set_error(job, "out of memory while validating the graph");
    return ENOMEM;
  }
  const sl_op *cycle = 0;
  for (int i = 0; i < job->op_count && !cycle; i++)
    if (color[i] == WHITE)
      cycle = find_cycle(job->ops[i], color);
  free(color);
  if (cycle) {
    sl_job_set_error(job, "the graph has a cycle through operator '%s'",
                     cycle->name);
    return SL_EGRAPH;
  }
  for (int i = 0; i < job->op_count; i++) {
    const sl_op *op = job->ops[i];
    if (op->kind != SL_OP_SINK && op->consumer_count == 0) {
      sl_job_set_error(job,
                       "operator '%s' (%s): its output is not consumed by any "
                       "operator (dangling stream; end it with a sink)",
                       op->name, kind_name(op->kind));
      return SL_EGRAPH;
    }
    if (op->kind == SL_OP_PROCESS && op->input_count == 0) {
      sl_job_set_error(job, "operator '%s' (process): it has no input",
                       op->name);
      return SL_EGRAPH;
    }
    if (sl_op_kind_is_virtual(op->kind))
      continue;
    int rc = check_key_kinds(job, op);
    if (rc)
      return rc;
    for (int k = 0; k < op->input_count; k++)
      if (reaches_through_key_by(op->inputs[k]) &&
          (uint32_t)op->parallelism > job->config.max_parallelism) {
        sl_job_set_error(job,
                         "operator '%s': keyed parallelism %d exceeds "
                         "max_parallelism %u",
                         op->name, op->parallelism,
                         job->config.max_parallelism);
        return SL_EGRAPH;
      }
  }
  assert(builder_check(job));
  return 0;
}

/* ------------------------------------------------------------ compiling */

typedef struct sl_edge {
  sl_op *producer;
  sl_op *consumer;
  int input;
  enum sl_partition partition;
  sl_key_fn key;
  void *key_user;
  int port; /* side output port of the producer, 0 for the main output */
  int first_ring;
} sl_edge;

typedef struct edge_list {
  sl_edge *edges;
  int count;
  int capacity;
} edge_list;

/* Follow from (logical input `input` of consumer) back through virtual
 * operators to physical producers, adding one edge per producer. */
static int resolve_edges(edge_list *list, sl_op *consumer, int input,
                         sl_op *from, sl_key_fn key, void *key_user,
                         int port) {
  if (from->kind == SL_OP_SIDE)
    return resolve_edges(list, consumer, input, from->inputs[0], key,
                         key_user, from->port);
  if (from->kind == SL_OP_KEY_BY) {
    /* The key_by nearest the consumer decides: an inner key_by that an
     * outer one re-keys has no say over this edge. */
    if (key)
      return resolve_edges(list, consumer, input, from->inputs[0], key,
                           key_user, port);
    return resolve_edges(list, consumer, input, from->inputs[0], from->fn.key,
                         from->user, port);
  }
  if (from->kind == SL_OP_UNION) {
    for (int i = 0; i < from->input_count; i++) {
      int rc = resolve_edges(list, consumer, input, from->inputs[i], key,
                             key_user, port);
      if (rc)
        return rc;
    }
    return 0;
  }
  if (list->count == list->capacity) {
    int capacity = list->capacity ? list->capacity * 2 : 16;
    sl_edge *grown = realloc(list->edges, sizeof *grown * (size_t)capacity);
    if (!grown)
      return ENOMEM;
    list->edges = grown;
    list->capacity = capacity;
  }
  sl_edge *e = &list->edges[list->count++];
  e->producer = from;
  e->consumer = consumer;
  e->input = input;
  e->key = key;
  e->key_user = key_user;
  e->port = port;
  if (key)
    e->partition = SL_PARTITION_HASH;
  else if (from->parallelism == consumer->parallelism)
    e->partition = SL_PARTITION_FORWARD;
  else
    e->partition = SL_PARTITION_REBALANCE;
  return 0;
}

/* Ring size when the configuration leaves it automatic: the budget shared
 * by ring_count rings, a power of two within the bounds, and never too
 * small for a record of max_record_bytes. */
static uint64_t auto_ring_bytes(int ring_count, uint32_t max_record_bytes) {
  uint64_t bytes = SL_AUTO_RING_MAX_BYTES;
  while (bytes > SL_AUTO_RING_MIN_BYTES &&
         bytes * (uint64_t)(ring_count > 0 ? ring_count : 1) >
             SL_RING_BUDGET_BYTES)
    bytes >>= 1;
  uint64_t needed = round_up_pow2(4 * ((uint64_t)max_record_bytes + 16));
  return bytes < needed ? needed : bytes;
}

static int edge_ring_count(const sl_edge *e) {
  return e->partition == SL_PARTITION_FORWARD
             ? e->producer->parallelism
             : e->producer->parallelism * e->consumer->parallelism;
}

/* Ring of edge e from producer instance p to consumer instance c. */
static sl_ring *edge_ring(sl_job *job, const sl_edge *e, int p, int c) {
  if (e->partition == SL_PARTITION_FORWARD) {
    assert(p == c);
    return &job->rings[e->first_ring + p];
  }
  return &job->rings[e->first_ring + p * e->consumer->parallelism + c];
}

static int instances_create(sl_job *job) {
  int total = 0;
  for (int i = 0; i < job->physical_count; i++)
    total += job->physical[i]->parallelism;
  job->instances = calloc((size_t)total, sizeof *job->instances);
  if (!job->instances)
    return ENOMEM;
  for (int i = 0; i < job->physical_count; i++) {
    sl_op *op = job->physical[i];
    /* Cache-line aligned so no two instances' hot fields share a line. */
    size_t bytes = sizeof(sl_instance) * (size_t)op->parallelism;
    bytes = (bytes + SL_CACHE_LINE - 1) / SL_CACHE_LINE * SL_CACHE_LINE;
    op->instances = aligned_alloc(SL_CACHE_LINE, bytes);
    if (!op->instances)
      return ENOMEM;
    memset(op->instances, 0, bytes);
    for (int k = 0; k < op->parallelism; k++) {
      sl_instance *inst = &op->instances[k];
      inst->job = job;
      inst->op = op;
      inst->index = k;
      inst->cpu = -1;
      inst->runner = inst; /* its own thread until plan_chains */
      inst->in_sink = op->kind == SL_OP_SINK;
      sl_parker_init(&inst->parker);
      sl_event_reset(inst);
      if (op->kind == SL_OP_MAP) {
        inst->scratch = aligned_alloc(8, sl_round8(op->out_max_bytes));
        if (!inst->scratch)
          return ENOMEM;
      }
      job->instances[job->instance_count++] = inst;
    }
  }
  return 0;
}

/* The CPUs the job may use (cpus.c): the explicit list's distinct CPUs,
 * else the affinity mask's, capped by the cgroup quota.  Sets
 * job->usable_cpus. */
static int resolve_usable_cpus(sl_job *job) {
  int cpu_count = 0;
  if (job->config.cpu_count > 0 && !job->config.no_pinning) {
    /* Distinct CPUs: a list may name one CPU twice. */
    cpu_set_t seen;
    CPU_ZERO(&seen);
    for (int i = 0; i < job->config.cpu_count; i++)
      CPU_SET(job->config.cpus[i], &seen);
    cpu_count = CPU_COUNT(&seen);
  } else {
    int *cpus = 0;
    int rc = sl_cpus_allowed(&cpus, &cpu_count);
    if (rc)
      return rc;
    free(cpus);
  }
  job->usable_cpus = sl_cpus_usable(cpu_count);
  assert(job->usable_cpus >= 1 && job->usable_cpus <= cpu_count);
  return 0;
}

/* The spin limit when the configuration leaves it at 0 (automatic): by
 * the usable CPUs, quota included (a spinner on a throttled cgroup burns
 * the time its peers need). */
static void resolve_spin(sl_job *job) {
  if (job->config.spin_iterations != 0) {
    job->spin_iterations = job->config.spin_iterations;
    return;
  }
  job->spin_iterations = job->thread_count > job->usable_cpus
                             ? SL_SPIN_OVERSUBSCRIBED
                             : SL_SPIN_DEDICATED;
}

/* Pinning (sluice.h, sl_job_config.cpus): to the explicit list, else to
 * the affinity mask's CPUs in its order.  Under a cgroup quota of fewer
 * CPUs than the mask holds, instances are not pinned by default: any
 * subset of the mask chosen here would be the same subset in every
 * process of every container sharing those CPUs (a Kubernetes pod
 * without a cpuset sees them all), piling them onto CPU 0..n-1, while
 * the kernel spreads unpinned threads and the quota still holds. */
static int assign_cpus(sl_job *job) {
  int rc = 0;
  resolve_spin(job);
  if (job->config.no_pinning)
    return 0;
  int *cpus = job->cpus;
  int count = job->config.cpu_count;
  int *owned = 0;
  if (count == 0) {
    rc = sl_cpus_allowed(&owned, &count);
    if (rc)
      return rc;
    if (job->usable_cpus < count) { /* a quota below the mask: see above */
      free(owned);
      return 0;
    }
    cpus = owned;
  }
  /* Threads get CPUs; an instance chained into another's thread
   * (runtime.c note 12) takes its runner's.  Each thread's place in the
   * job's own order goes to sl_cpus_place, which rotates it away from the
   * CPUs other jobs of the process hold (cpus.c note 8). */
  sl_instance **runners = calloc((size_t)job->thread_count + 1, sizeof *runners);
  int *slot = calloc((size_t)job->thread_count + 1, sizeof *slot);
  job->placed_cpus = calloc((size_t)job->thread_count + 1, sizeof(int));
  if (!runners || !slot || !job->placed_cpus) {
    free(runners);
    free(slot);
    free(job->placed_cpus);
    job->placed_cpus = 0;
    free(owned);
    return ENOMEM;
  }
  int position = 0;
  if (job->config.pin_policy == SL_PIN_ROUND_ROBIN) {
    for (int i = 0; i < job->instance_count; i++)
      if (job->instances[i]->runner == job->instances[i]) {
        runners[position] = job->instances[i];
        slot[position] = position % count;
        position++;
      }
  } else {
    /* Chain order: instance k of every operator before instance k+1. */
    int max_parallelism = 1;
    for (int i = 0; i < job->physical_count; i++)
      if (job->physical[i]->parallelism > max_parallelism)
        max_parallelism = job->physical[i]->parallelism;
    for (int k = 0; k < max_parallelism; k++)
      for (int i = 0; i < job->physical_count; i++) {
        sl_op *op = job->physical[i];
        if (k >= op->parallelism || op->instances[k].runner != &op->instances[k])
          continue;
        /* Contiguous blocks: position p of N goes to CPU p * n / N. */
        runners[position] = &op->instances[k];
        slot[position] = (int)((int64_t)position * count / job->thread_count);
        position++;
      }
  }
  assert(position == job->thread_count);
  sl_cpus_place(cpus, count, slot, position, job->config.cpu_count == 0,
                job->placed_cpus);
  job->placed_count = position;
  for (int t = 0; t < position; t++)
    runners[t]->cpu = job->placed_cpus[t];
  free(runners);
  free(slot);
  for (int i = 0; i < job->instance_count; i++)
    job->instances[i]->cpu = job->instances[i]->runner->cpu;
  free(owned);
  return 0;
}

/* Chained rings (runtime.c note 12) are read in their producer's thread
 * right after it publishes, so they need not absorb a consumer's delay:
 * this size keeps them in the caches, unless a record needs more. */
#define SL_CHAIN_RING_BYTES (64u << 10)

static bool chaining_wanted(const sl_job *job) {
  if (job->config.chaining == SL_CHAINING_NEVER)
    return false;
  if (job->config.chaining == SL_CHAINING_ALWAYS)
    return true;
  return job->instance_count > job->usable_cpus; /* SL_CHAINING_AUTO */
}

/* runtime.c note 12: which instances run in another's thread.  An
 * instance is chained to its upstream instance when its only channel is
 * that instance's only ring on one output (a forward edge, or an edge
 * between two operators of parallelism 1) and neither operator opted
 * out.  Then every instance gets its runner, the end of its chain
 * upstream, every runner the list of its members, and every ring the
 * parkers of the threads at its ends.  O(instances^2 x outputs), once at
 * compile time. */
static int plan_chains(sl_job *job) {
  job->thread_count = job->instance_count;
  if (!chaining_wanted(job))
    return 0;
  int n = job->instance_count;
  /* up[i]: the instance i is chained to (-1: none), by output up_out[i]. */
  int *links = malloc(sizeof(int) * 2 * (size_t)n);
  if (!links)
    return ENOMEM;
  int *up = links, *up_out = links + n;
  for (int i = 0; i < n; i++)
    up[i] = up_out[i] = -1;
  for (int i = 0; i < n; i++) {
    sl_instance *c = job->instances[i];
    if (c->channel_count != 1 || c->op->no_chaining)
      continue;
    sl_ring *ring = c->channels[0].ring;
    for (int j = 0; j < n && up[i] < 0; j++) {
      sl_instance *p = job->instances[j];
      if (p->op->no_chaining)
        continue;
      for (int o = 0; o < p->output_count; o++) {
        const sl_output *out = &p->outputs[o];
        if (out->ring_count == 1 && out->rings[0] == ring) {
          up[i] = j;
          up_out[i] = o;
          break;
        }
      }
    }
  }
  uint64_t chain_bytes = round_up_pow2(
      4 * ((uint64_t)job->config.max_record_bytes + 16));
  if (chain_bytes < SL_CHAIN_RING_BYTES)
    chain_bytes = SL_CHAIN_RING_BYTES;
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    if (up[i] < 0)
      continue;
    sl_instance *c = job->instances[i], *p = job->instances[up[i]];
    sl_output *out = &p->outputs[up_out[i]];
    sl_ring *ring = out->rings[0];
    out->chained = c;
    p->chained_outputs++;
    c->runner = p; /* for now: the runner is found below */
    sl_ring_destroy(ring);
    rc = sl_ring_init(ring, chain_bytes, &c->parker, &p->parker,
                      job->config.output_batch_records);
    ring->consumer_announce_seq = &c->cp.announce_seq;
  }
  free(links);
  /* Runners: up the chain to an instance that is chained to none.  The
   * graph has no cycle (sl_job_start refuses one), so this ends. */
  for (bool changed = rc == 0; changed;) {
    changed = false;
    for (int i = 0; i < n; i++) {
      sl_instance *inst = job->instances[i];
      if (inst->runner != inst && inst->runner->runner != inst->runner) {
        inst->runner = inst->runner->runner;
        changed = true;
      }
    }
  }
  job->thread_count = 0;
  for (int i = 0; i < job->instance_count && rc == 0; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->runner == inst) {
      job->thread_count++;
      continue;
    }
    sl_instance *r = inst->runner;
    sl_instance **grown =
        realloc(r->members, sizeof *grown * (size_t)(r->member_count + 1));
    if (!grown) {
      rc = ENOMEM;
      break;
    }
    r->members = grown;
    r->members[r->member_count++] = inst;
  }
  /* Every ring end sleeps on its thread's parker. */
  for (int i = 0; i < job->instance_count && rc == 0; i++) {
    sl_instance *inst = job->instances[i];
    for (int c = 0; c < inst->channel_count; c++)
      inst->channels[c].ring->consumer_parker = sl_instance_parker(inst);
    for (int o = 0; o < inst->output_count; o++)
      for (int k = 0; k < inst->outputs[o].ring_count; k++)
        inst->outputs[o].rings[k]->producer_parker = sl_instance_parker(inst);
  }
  return rc;
}

/* Allocate channel and output arrays, then wire every ring of every edge. */
static int wire_edges(sl_job *job, const edge_list *list) {
  for (int i = 0; i < list->count; i++) {
    const sl_edge *e = &list->edges[i];
    for (int c = 0; c < e->consumer->parallelism; c++)
      e->consumer->instances[c].channel_count +=
          e->partition == SL_PARTITION_FORWARD ? 1 : e->producer->parallelism;
    for (int p = 0; p < e->producer->parallelism; p++)
      e->producer->instances[p].output_count++;
  }
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->channel_count) {
      inst->channels = calloc((size_t)inst->channel_count, sizeof(sl_channel));
      if (!inst->channels)
        return ENOMEM;
    }
    if (inst->output_count) {
      inst->outputs = calloc((size_t)inst->output_count, sizeof(sl_output));
      if (!inst->outputs)
        return ENOMEM;
    }
    inst->channel_count = 0; /* refilled below */
    inst->output_count = 0;
  }
  for (int i = 0; i < list->count; i++) {
    const sl_edge *e = &list->edges[i];
    sl_op *P = e->producer, *C = e->consumer;
    for (int p = 0; p < P->parallelism; p++) {
      sl_instance *producer = &P->instances[p];
      sl_output *out = &producer->outputs[producer->output_count++];
      out->partition = e->partition;
      out->key = e->key;
      out->key_user = e->key_user;
      out->port = e->port;
      out->ring_count =
          e->partition == SL_PARTITION_FORWARD ? 1 : C->parallelism;
      /* Spread the producers' round-robin starting points. */
      out->next = (uint32_t)(p % out->ring_count);
      out->rings = calloc((size_t)out->ring_count, sizeof(sl_ring *));
      if (!out->rings)
        return ENOMEM;
      if (e->partition == SL_PARTITION_HASH) {
        uint32_t groups = job->config.max_parallelism;
        out->group_instance = malloc(sizeof(uint16_t) * groups);
        if (!out->group_instance)
          return ENOMEM;
        for (uint32_t g = 0; g < groups; g++)
          out->group_instance[g] =
              (uint16_t)sl_group_instance(g, groups, C->parallelism);
      }
      for (int c = 0; c < C->parallelism; c++) {
        if (e->partition == SL_PARTITION_FORWARD && c != p)
          continue;
        sl_instance *consumer = &C->instances[c];
        sl_ring *ring = edge_ring(job, e, p, c);
        int rc = sl_ring_init(ring, job->ring_bytes, &consumer->parker,
                              &producer->parker,
                              job->config.output_batch_records);
        if (rc)
          return rc;
        ring->consumer_announce_seq = &consumer->cp.announce_seq;
        out->rings[e->partition == SL_PARTITION_FORWARD ? 0 : c] = ring;
        sl_channel *ch = &consumer->channels[consumer->channel_count++];
        ch->ring = ring;
        ch->input = e->input;
        ch->watermark = SL_WATERMARK_MIN;
        if (e->partition == SL_PARTITION_HASH) {
          ch->key = e->key;
          ch->key_user = e->key_user;
        }
      }
    }
  }
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    if (inst->output_count == 1 && inst->outputs[0].ring_count == 1 &&
        inst->outputs[0].port == 0)
      inst->forward_ring = inst->outputs[0].rings[0];
  }
  return 0;
}

/* ------------------------------------------------------------ checkers */

/* The edges sl_job_compile resolved: both ends physical operators of the
 * job, the input and port in range, the partition consistent with the
 * parallelisms (FORWARD: equal) and the key (HASH: a key function), and
 * the rings laid out edge after edge, exactly ring_count of them.
 * O(edges). */
static __attribute__((unused)) bool edges_check(const sl_job *job,
                                                const edge_list *list) {
  int next_ring = 0;
  for (int i = 0; i < list->count; i++) {
    const sl_edge *e = &list->edges[i];
    const sl_op *P = e->producer, *C = e->consumer;
    if (P->physical_index < 0 || P->physical_index >= job->physical_count ||
        job->physical[P->physical_index] != P)
      return false;
    if (C->physical_index < 0 || C->physical_index >= job->physical_count ||
        job->physical[C->physical_index] != C)
      return false;
    if (e->input < 0 || e->input >= C->input_count)
      return false;
    if (e->port < 0 || e->port > SL_MAX_SIDE_OUTPUTS ||
        (e->port > 0 && P->kind != SL_OP_PROCESS))
      return false;
    if ((e->partition == SL_PARTITION_HASH) != (e->key != 0))
      return false;
    if (e->partition == SL_PARTITION_FORWARD &&
        P->parallelism != C->parallelism)
      return false;
    if (e->first_ring != next_ring)
      return false;
    next_ring += edge_ring_count(e);
  }
  return next_ring == job->ring_count;
}

/* One instance as compiled: in its operator's array at its index; every
 * channel a ring of the job whose one consumer is this instance, every
 * output ring one whose one producer is this instance (DESIGN.md
 * invariant 1); FORWARD outputs have one ring, HASH outputs a key and a
 * key-group table; ports in range.  Adds its channels and output rings to
 * the counts.  O(channels + output rings). */
static __attribute__((unused)) bool instance_check(const sl_job *job,
                                                   const sl_instance *inst,
                                                   long *channels,
                                                   long *output_rings) {
  const sl_op *op = inst->op;
  if (inst->job != job || inst->index < 0 || inst->index >= op->parallelism ||
      &op->instances[inst->index] != inst)
    return false;
  if (op->kind == SL_OP_SOURCE && inst->channel_count != 0)
    return false;
  const sl_ring *first = job->rings, *end = job->rings + job->ring_count;
  for (int c = 0; c < inst->channel_count; c++) {
    const sl_channel *ch = &inst->channels[c];
    if (ch->ring < first || ch->ring >= end ||
        ch->ring->consumer_parker != sl_instance_parker((sl_instance *)inst) ||
        ch->input < 0 || ch->input >= op->input_count)
      return false;
  }
  for (int o = 0; o < inst->output_count; o++) {
    const sl_output *out = &inst->outputs[o];
    if (out->port < 0 || out->port > SL_MAX_SIDE_OUTPUTS || out->ring_count < 1 ||
        (out->partition == SL_PARTITION_FORWARD && out->ring_count != 1))
      return false;
    if (out->partition == SL_PARTITION_HASH &&
        (!out->key || !out->group_instance ||
         out->group_instance[0] >= out->ring_count ||
         out->group_instance[job->config.max_parallelism - 1] >=
             out->ring_count))
      return false;
    for (int r = 0; r < out->ring_count; r++)
      if (out->rings[r] < first || out->rings[r] >= end ||
          out->rings[r]->producer_parker !=
              sl_instance_parker((sl_instance *)inst))
        return false;
    *output_rings += out->ring_count;
  }
  *channels += inst->channel_count;
  return true;
}

/* The physical operators: the non-virtual ones, in id order, each with
 * its index and its instances, their parallelisms adding up to
 * instance_count.  Nothing here changes after sl_job_compile, so any
 * thread may check it while the job runs (sl_graph_fingerprint).
 * O(operators). */
static __attribute__((unused)) bool physical_check(const sl_job *job) {
  int physical = 0, instances = 0, last_id = -1;
  for (int i = 0; i < job->op_count; i++)
    physical += !sl_op_kind_is_virtual(job->ops[i]->kind);
  if (physical != job->physical_count)
    return false;
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    if (sl_op_kind_is_virtual(op->kind) || op->physical_index != i ||
        op->id <= last_id || !op->instances)
      return false;
    last_id = op->id;
    instances += op->parallelism;
  }
  return instances == job->instance_count;
}

/* The compiled job: physical_check; every instance passes
 * instance_check; and each ring is read by exactly one channel and
 * written by exactly one output (the counts match, and instance_check
 * tied each end to one instance).  Asserted at the end of
 * sl_job_compile and by a restart (failover.c), while no instance thread
 * runs (sl_ring_reset rewrites the rings' parker fields).  O(operators +
 * instances + rings). */
bool sl_graph_check(const sl_job *job) {
  if (!physical_check(job))
    return false;
  long channels = 0, output_rings = 0;
  for (int i = 0; i < job->instance_count; i++)
    if (!instance_check(job, job->instances[i], &channels, &output_rings))
      return false;
  return channels == job->ring_count && output_rings == job->ring_count;
}

int sl_job_compile(sl_job *job) {
  job->physical = calloc((size_t)job->op_count, sizeof *job->physical);
  if (!job->physical)
    return ENOMEM;
  for (int i = 0; i < job->op_count; i++) {
    sl_op *op = job->ops[i];
    if (sl_op_kind_is_virtual(op->kind))
      continue;
    op->physical_index = job->physical_count;
    job->physical[job->physical_count++] = op;
  }
  edge_list list = {0};
  int rc = 0;
  for (int i = 0; i < job->physical_count && rc == 0; i++) {
    sl_op *op = job->physical[i];
    for (int k = 0; k < op->input_count && rc == 0; k++)
      rc = resolve_edges(&list, op, k, op->inputs[k], 0, 0, 0);
  }
  if (rc == 0) {
    for (int i = 0; i < list.count; i++) {
      list.edges[i].first_ring = job->ring_count;
      job->ring_count += edge_ring_count(&list.edges[i]);
    }
    job->ring_bytes = job->config.ring_bytes
                          ? job->config.ring_bytes
                          : auto_ring_bytes(job->ring_count,
                                            job->config.max_record_bytes);
    size_t bytes = sizeof(sl_ring) * (size_t)(job->ring_count ? job->ring_count : 1);
    job->rings = aligned_alloc(SL_CACHE_LINE, bytes);
    rc = job->rings ? 0 : ENOMEM;
    if (rc == 0)
      memset(job->rings, 0, bytes);
  }
  if (rc == 0)
    rc = instances_create(job);
  if (rc == 0)
    rc = resolve_usable_cpus(job);
  if (rc == 0)
    rc = wire_edges(job, &list);
  if (rc == 0)
    rc = plan_chains(job);
  if (rc == 0)
    rc = assign_cpus(job);
  assert(rc != 0 || edges_check(job, &list));
  free(list.edges);
  if (rc)
    sl_job_free_compiled(job);
  assert(rc != 0 || sl_graph_check(job));
  return rc;
}

/* The text a store remembers its job graph by: every physical operator's
 * id, kind, name and parallelism, and the key-group count.  Stores compare
 * it byte for byte, so its form never changes; an operator keyed by byte
 * strings has "+bytes" after its kind (a form no older store holds), since
 * its state cannot be read as 64-bit-keyed state or the other way round. */
char *sl_graph_fingerprint(const sl_job *job) {
  assert(physical_check(job));
  size_t cap = 64 + (size_t)job->physical_count * (SL_MAX_NAME + 48);
  char *text = malloc(cap);
  if (!text)
    return 0;
  size_t used = (size_t)snprintf(text, cap, "max_parallelism=%" PRIu32,
                                 job->config.max_parallelism);
  for (int i = 0; i < job->physical_count; i++) {
    const sl_op *op = job->physical[i];
    assert(!sl_op_kind_is_virtual(op->kind));
    int keys = KEYS_NONE;
    for (int k = 0; k < op->input_count; k++)
      keys |= stream_keys(op->inputs[k]);
    used += (size_t)snprintf(text + used, cap - used, ";%d:%s%s:%s:%d", op->id,
                             kind_name(op->kind),
                             keys == KEYS_BYTES ? "+bytes" : "", op->name,
                             op->parallelism);
  }
  assert(used < cap);
  return text;
}

void sl_job_free_compiled(sl_job *job) {
  sl_checkpointer_free(job); /* first: its writer reads the cow maps */
  sl_cpus_unplace(job->placed_cpus, job->placed_count); /* cpus.c note 8 */
  free(job->placed_cpus);
  job->placed_cpus = 0;
  job->placed_count = 0;
  sl_failover_free(job);
  sl_inject_free(job);
  for (int i = 0; i < job->instance_count; i++)
    sl_snapshot_instance_free(job->instances[i]);
  for (int i = 0; i < job->ring_count; i++)
    sl_ring_destroy(&job->rings[i]); /* safe on never-initialised rings */
  free(job->rings);
  job->rings = 0;
  job->ring_count = 0;
  for (int i = 0; i < job->instance_count; i++) {
    sl_instance *inst = job->instances[i];
    /* After a failed allocation in wire_edges, counts may be set while the
     * arrays are not. */
    for (int k = 0; inst->outputs && k < inst->output_count; k++) {
      free(inst->outputs[k].rings);
      free(inst->outputs[k].group_instance);
    }
    free(inst->outputs);
    free(inst->channels);
    free(inst->members);
    free(inst->scratch);
    sl_event_free(inst);
  }
  for (int i = 0; i < job->physical_count; i++) {
    free(job->physical[i]->instances);
    job->physical[i]->instances = 0;
  }
  free(job->instances);
  job->instances = 0;
  job->instance_count = 0;
  free(job->physical);
  job->physical = 0;
  job->physical_count = 0;
}

SL_EXPORT void sl_job_destroy(sl_job *job) {
  if (!job)
    return;
  if (job->state == SL_JOB_RUNNING && !job->waited) {
    sl_job_stop(job);
    sl_job_wait(job);
  }
  sl_job_free_compiled(job);
  for (int i = 0; i < job->op_count; i++) {
    if (job->ops[i]->user_free)
      job->ops[i]->user_free(job->ops[i]->user);
    free(job->ops[i]);
  }
  free(job->ops);
  free(job->cpus);
  free(job->state_dir);
  free(job->from_savepoint);
  free(job->faults_text);
  free(job);
}

SL_EXPORT int sl_job_operator_count(const sl_job *job) {
  if (!job)
    return 0;
  if (job->physical)
    return job->physical_count;
  int n = 0;
  for (int i = 0; i < job->op_count; i++)
    n += !sl_op_kind_is_virtual(job->ops[i]->kind);
  return n;
}

SL_EXPORT const char *sl_job_error(const sl_job *job) {
  return job ? job->error : "";
}

/* The version-1 symbol (config_abi.c note 1): a program linked before the
 * sized call existed passed a version-1 struct. */
SL_EXPORT int(sl_op_watermarks)(sl_op *source,
                                const sl_watermark_config *config) {
  return sl_op_watermarks_sized(source, config, SL_WATERMARK_CONFIG_V1);
}
