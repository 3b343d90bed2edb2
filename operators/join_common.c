/* join_common.c — the operator shell the three joins share: the
 * per-instance buffers (open, close), the record and timer callbacks that
 * hand each record or timer to the join's own function and name what
 * failed, the config and input checks, and building the two-input keyed
 * process operator.  Each join's rules are in its own file
 * (join_window.c, join_interval.c, join_unbounded.c); what they share is
 * described in join_internal.h.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "join_internal.h"

/* ----------------------------------------------------------- helpers */

int join_record_begin(sl_ctx *ctx, const sl_record *in, int64_t *ts,
                      uint64_t *key, int64_t *watermark) {
  *ts = in->timestamp;
  *watermark = sl_ctx_watermark(ctx);
  if (in->timestamp == SL_NO_TIMESTAMP) {
    sl_ctx_fail(ctx, "a record without a timestamp reached an event-time "
                "join (emit with sl_emit_ts)");
    return EINVAL;
  }
  return sl_ctx_key(ctx, key);
}

int join_late_record(sl_ctx *ctx, const join_op *j, int side,
                     const sl_record *in) {
  sl_ctx_count(ctx, SL_COUNT_LATE, 1);
  if (j->late_port[side])
    return sl_emit_side(ctx, j->late_port[side], in->data, in->size_bytes,
                        in->timestamp);
  return 0;
}

/* ----------------------------------------------------------- callbacks */

static int join_open(sl_ctx *ctx, void *user, void **state) {
  (void)ctx;
  join_instance *s = calloc(1, sizeof *s);
  if (!s)
    return ENOMEM;
  s->j = user;
  *state = s;
  return 0;
}

static void join_close(sl_ctx *ctx, void *state) {
  (void)ctx;
  join_instance *s = state;
  if (!s)
    return;
  free(s->element);
  for (int side = 0; side < 2; side++) {
    free(s->sides[side].refs);
    free(s->sides[side].bytes);
  }
  free(s->directory);
  free(s->bucket);
  free(s->matches);
  free(s);
}

static int join_process(sl_ctx *ctx, void *state, int input,
                        const sl_record *in) {
  join_instance *s = state;
  assert(input == LEFT || input == RIGHT);
  int rc = s->j->process(ctx, s, input, in);
  return fail_status(ctx, rc, input == LEFT ? "join, left record"
                                            : "join, right record");
}

static int join_on_timer(sl_ctx *ctx, void *state, int domain,
                         int64_t time) {
  join_instance *s = state;
  if (domain != SL_EVENT_TIME)
    return 0;
  assert(s->j->timer); /* registered only by joins that have timers */
  int rc = s->j->timer(ctx, s, time);
  return fail_status(ctx, rc, "join timer");
}

/* ----------------------------------------------------------- building */

int join_config_error(sl_job *job, const char *what, const char *name,
                      const char *text) {
  sl_job_set_error(job, "%s '%s': %s", what, name ? name : "(null)", text);
  return EINVAL;
}

int join_check_port(sl_job *job, const char *what, const char *name,
                    int port, const char *field) {
  if (port >= 0 && port <= SL_MAX_SIDE_OUTPUTS)
    return 0;
  sl_job_set_error(job, "%s '%s': %s must be 0..SL_MAX_SIDE_OUTPUTS (%d)",
                   what, name ? name : "(null)", field, SL_MAX_SIDE_OUTPUTS);
  return EINVAL;
}

static int check_keyed(sl_job *job, const char *what, const char *name,
                       const sl_op *input, const char *side) {
  if (!input) {
    sl_job_set_error(job, "%s '%s': the %s input is NULL", what,
                     name ? name : "(null)", side);
    return SL_EGRAPH;
  }
  if (input->kind != SL_OP_KEY_BY) {
    sl_job_set_error(job, "%s '%s': its %s input '%s' is not keyed (put an "
                     "sl_op_key_by in front whose key is the join key)",
                     what, name ? name : "(null)", side, input->name);
    return SL_EGRAPH;
  }
  return 0;
}

int join_build(sl_job *job, const char *what, const char *name, sl_op *left,
               sl_op *right, int parallelism, join_op *j,
               join_process_fn process, join_timer_fn timer, sl_op **op) {
  assert(process);
  j->process = process;
  j->timer = timer;
  int rc = check_keyed(job, what, name, left, "left");
  if (rc == 0)
    rc = check_keyed(job, what, name, right, "right");
  if (rc) {
    free(j);
    return rc;
  }
  sl_op *inputs[2] = {left, right};
  sl_process_ops ops = {.open = join_open,
                        .process = join_process,
                        .close = join_close,
                        .on_timer = timer ? join_on_timer : 0};
  rc = sl_op_process(job, name, inputs, 2, parallelism, &ops, j, op);
  return op_adopt(rc, op, j, free);
}

