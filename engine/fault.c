/* fault.c — parsing fault specs into plans, and deciding when a planned
 * fault fires.  The syntax and the design notes are in fault.h.
 *
 * The parser works on one fault at a time: the spec is cut at ';', each
 * non-empty piece is trimmed, kept as the fault's text and copied into a
 * scratch buffer that is cut in place at ':' ',' and '='.  Every error
 * names the fault (origin, 1-based index, text) and the offending token.
 */
#include "fault.h"
#include "log.h"

#include <assert.h>
#include <errno.h>
#include <lmdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ tables */

/* In the order error messages list them ("it takes op, instance, ..."). */
enum param_id {
  P_OP,
  P_INSTANCE,
  P_CALL,
  P_ERROR,
  P_POINT,
  P_RECORD,
  P_PROB,
  P_SEED,
  P_DELAY_US,
  P_FROM,
  P_RECORDS,
  P_NTH,
  P_TIMES,
  P_PERSISTENT,
  P_TRANSIENT,
  P_COUNT,
};
_Static_assert(P_COUNT <= 32, "parameter sets are 32-bit masks");

#define BIT(p) (1u << (p))

/* hint: how the parameter is written, for "needs a value" messages. */
static const struct {
  const char *name;
  bool flag;
  const char *hint;
} params[P_COUNT] = {
    [P_OP] = {"op", false, "op=NAME"},
    [P_INSTANCE] = {"instance", false, "instance=K"},
    [P_RECORD] = {"record", false, "record=N"},
    [P_PROB] = {"prob", false, "prob=P"},
    [P_SEED] = {"seed", false, "seed=S"},
    [P_TIMES] = {"times", false, "times=N|inf"},
    [P_NTH] = {"nth", false, "nth=N"},
    [P_CALL] = {"call", false, "call=put|commit|sync"},
    [P_ERROR] = {"error", false, "error=EIO|ENOSPC|MAP_FULL"},
    [P_DELAY_US] = {"delay_us", false, "delay_us=D"},
    [P_FROM] = {"from", false, "from=N"},
    [P_RECORDS] = {"records", false, "records=M"},
    [P_POINT] = {"point", false,
                 "point=mid-write|after-commit|sink-commit|snapshot|"
                 "after-restore"},
    [P_PERSISTENT] = {"persistent", true, "persistent"},
    [P_TRANSIENT] = {"transient", true, "transient"},
};

#define KIND_COUNT (SL_FAULT_COMPLETE + 1)

static const struct {
  const char *name;
  uint32_t allowed; /* mask of param_id */
} kinds[KIND_COUNT] = {
    [SL_FAULT_FAIL] = {"fail", BIT(P_OP) | BIT(P_INSTANCE) | BIT(P_RECORD) |
                                   BIT(P_PROB) | BIT(P_SEED) | BIT(P_TIMES)},
    [SL_FAULT_SNAPSHOT] = {"snapshot", BIT(P_OP) | BIT(P_INSTANCE) |
                                           BIT(P_NTH) | BIT(P_TIMES)},
    [SL_FAULT_WRITE] = {"write", BIT(P_NTH) | BIT(P_TIMES)},
    [SL_FAULT_RESTORE] = {"restore", BIT(P_OP) | BIT(P_INSTANCE) |
                                         BIT(P_NTH) | BIT(P_TIMES)},
    [SL_FAULT_STORE] = {"store", BIT(P_CALL) | BIT(P_ERROR) | BIT(P_NTH) |
                                     BIT(P_TIMES) | BIT(P_PERSISTENT) |
                                     BIT(P_TRANSIENT)},
    [SL_FAULT_SLOW] = {"slow", BIT(P_OP) | BIT(P_INSTANCE) | BIT(P_DELAY_US) |
                                   BIT(P_FROM) | BIT(P_RECORDS)},
    [SL_FAULT_CRASH] = {"crash", BIT(P_POINT) | BIT(P_NTH)},
    [SL_FAULT_COMPLETE] = {"complete", BIT(P_OP) | BIT(P_INSTANCE) |
                                           BIT(P_NTH) | BIT(P_TIMES)},
};

static const char *const call_names[] = {
    [SL_FAULT_CALL_PUT] = "put",
    [SL_FAULT_CALL_COMMIT] = "commit",
    [SL_FAULT_CALL_SYNC] = "sync",
};

static const char *const point_names[] = {
    [SL_CRASH_MID_WRITE] = "mid-write",
    [SL_CRASH_AFTER_COMMIT] = "after-commit",
    [SL_CRASH_SINK_COMMIT] = "sink-commit",
    [SL_CRASH_SNAPSHOT] = "snapshot",
    [SL_CRASH_AFTER_RESTORE] = "after-restore",
};

#define CALL_COUNT (int)(sizeof call_names / sizeof call_names[0])
#define POINT_COUNT (int)(sizeof point_names / sizeof point_names[0])

static const struct {
  const char *name;
  int error;
} errors[] = {
    {"EIO", EIO},
    {"ENOSPC", ENOSPC},
    {"MAP_FULL", MDB_MAP_FULL},
};

#define ERROR_COUNT (int)(sizeof errors / sizeof errors[0])

const char *sl_fault_kind_name(enum sl_fault_kind kind) {
  return (unsigned)kind < KIND_COUNT ? kinds[kind].name : "?";
}

const char *sl_fault_call_name(enum sl_fault_call call) {
  return (int)call >= 0 && (int)call < CALL_COUNT ? call_names[call] : "?";
}

const char *sl_fault_point_name(enum sl_fault_point point) {
  return (int)point >= 0 && (int)point < POINT_COUNT ? point_names[point]
                                                     : "?";
}

const char *sl_fault_error_name(int error) {
  for (int i = 0; i < ERROR_COUNT; i++)
    if (errors[i].error == error)
      return errors[i].name;
  return "?";
}

/* ------------------------------------------------------------ parse state */

/* Where the parser is, for error messages. */
typedef struct parse_ctx {
  char *err;
  size_t err_bytes;
  const char *origin; /* NULL: no prefix */
  int index;          /* 1-based, within the origin's spec */
  const char *piece;  /* the fault's trimmed text, not NUL-terminated */
  size_t piece_bytes;
} parse_ctx;

/* The fault's text is quoted in full unless it is absurdly long: the
 * message is for a person, and 80 bytes show where it went wrong. */
#define QUOTE_MAX_BYTES 80

static int fault_error(const parse_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Fill ctx->err with "[origin: ]fault N ('text'): " and the message.
 * Returns EINVAL, so callers can `return fault_error(...)`. */
static int fault_error(const parse_ctx *ctx, const char *fmt, ...) {
  if (!ctx->err || ctx->err_bytes == 0)
    return EINVAL;
  bool cut = ctx->piece_bytes > QUOTE_MAX_BYTES;
  int quoted = (int)(cut ? QUOTE_MAX_BYTES : ctx->piece_bytes);
  int n = snprintf(ctx->err, ctx->err_bytes, "%s%sfault %d ('%.*s%s'): ",
                   ctx->origin ? ctx->origin : "", ctx->origin ? ": " : "",
                   ctx->index, quoted, ctx->piece, cut ? "..." : "");
  if (n >= 0 && (size_t)n < ctx->err_bytes) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->err + n, ctx->err_bytes - (size_t)n, fmt, ap);
    va_end(ap);
  }
  return EINVAL;
}

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
         c == '\f';
}

/* Trim s in place: returns the first non-space byte and cuts the string
 * after the last one. */
static char *trim(char *s) {
  while (is_space(*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && is_space(s[n - 1]))
    n--;
  s[n] = 0;
  return s;
}

/* "op, instance, record" for the parameters in mask. */
static void list_params(uint32_t mask, char *buf, size_t n) {
  assert(n > 0);
  buf[0] = 0;
  size_t used = 0;
  for (int p = 0; p < P_COUNT; p++) {
    if (!(mask & BIT(p)))
      continue;
    int w = snprintf(buf + used, n - used, "%s%s", used ? ", " : "",
                     params[p].name);
    if (w < 0 || (size_t)w >= n - used)
      return; /* cut: the buffer below is sized to fit every list */
    used += (size_t)w;
  }
}

/* ------------------------------------------------------------ values */

enum number_status { NUMBER_OK, NUMBER_SYNTAX, NUMBER_OVERFLOW };

/* Decimal digits only: no sign, no space, no base prefix. */
static enum number_status parse_u64(const char *s, uint64_t *out) {
  if (!*s)
    return NUMBER_SYNTAX;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9')
      return NUMBER_SYNTAX;
    unsigned digit = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - digit) / 10)
      return NUMBER_OVERFLOW;
    v = v * 10 + digit;
  }
  *out = v;
  return NUMBER_OK;
}

/* A number parameter within lo..hi, or an error naming it. */
static int number_value(const parse_ctx *ctx, enum param_id p,
                        const char *value, uint64_t lo, uint64_t hi,
                        uint64_t *out) {
  const char *name = params[p].name;
  switch (parse_u64(value, out)) {
  case NUMBER_SYNTAX:
    return fault_error(ctx, "bad %s '%s': not a decimal number", name, value);
  case NUMBER_OVERFLOW:
    return fault_error(ctx, "bad %s '%s': larger than %llu", name, value,
                       (unsigned long long)UINT64_MAX);
  case NUMBER_OK:
    break;
  }
  if (*out < lo || *out > hi) {
    if (hi == UINT64_MAX)
      return fault_error(ctx, "bad %s '%s': must be at least %llu", name,
                         value, (unsigned long long)lo);
    return fault_error(ctx, "bad %s '%s': must be %llu..%llu", name, value,
                       (unsigned long long)lo, (unsigned long long)hi);
  }
  return 0;
}

/* A probability written as DIGITS [ '.' DIGITS ] or '.' DIGITS, with at
 * least one digit.  Parsed by hand: strtod would also take signs,
 * exponents, hex, "inf" and "nan", and follows the locale's decimal point.
 * Whether it is 0 or above 1 is decided on the digits, exactly; the
 * double is only used for the threshold. */
static int prob_value(const parse_ctx *ctx, const char *value, double *out) {
  uint64_t whole = 0; /* saturates at 2: only 0, 1 and "more" matter */
  double fraction = 0, scale = 1;
  bool any_digit = false, fraction_nonzero = false, dot = false;
  for (const char *s = value; *s; s++) {
    if (*s == '.' && !dot) {
      dot = true;
      continue;
    }
    if (*s < '0' || *s > '9')
      return fault_error(ctx,
                         "bad prob '%s': not a decimal fraction (like 0.001)",
                         value);
    unsigned digit = (unsigned)(*s - '0');
    any_digit = true;
    if (!dot) {
      whole = whole * 10 + digit;
      if (whole > 2)
        whole = 2;
    } else {
      fraction_nonzero |= digit != 0;
      scale /= 10;
      fraction += digit * scale;
    }
  }
  if (!any_digit)
    return fault_error(ctx,
                       "bad prob '%s': not a decimal fraction (like 0.001)",
                       value);
  if (whole == 0 && !fraction_nonzero)
    return fault_error(ctx, "bad prob '%s': must be above 0", value);
  if (whole > 1 || (whole == 1 && fraction_nonzero))
    return fault_error(ctx, "bad prob '%s': must be at most 1", value);
  *out = whole == 1 ? 1.0 : fraction;
  return 0;
}

static int op_value(const parse_ctx *ctx, const char *value, sl_fault *f) {
  size_t n = strlen(value);
  if (n >= SL_MAX_NAME)
    return fault_error(ctx,
                       "bad op '%s': an operator name has at most %d bytes",
                       value, SL_MAX_NAME - 1);
  for (size_t i = 0; i < n; i++)
    if (strchr(",;=:", value[i]) || is_space(value[i]))
      return fault_error(ctx,
                         "bad op '%s': an operator name here cannot hold "
                         "',' ';' '=' ':' or whitespace",
                         value);
  memcpy(f->op, value, n + 1);
  return 0;
}

/* value among names[0..count-1], or an error listing them. */
static int name_value(const parse_ctx *ctx, enum param_id p,
                      const char *value, const char *const *names, int count,
                      int *out) {
  for (int i = 0; i < count; i++)
    if (strcmp(value, names[i]) == 0) {
      *out = i;
      return 0;
    }
  char list[128];
  size_t used = 0;
  list[0] = 0;
  for (int i = 0; i < count; i++) {
    const char *sep = i == 0 ? "" : i == count - 1 ? " or " : ", ";
    int w = snprintf(list + used, sizeof list - used, "%s%s", sep, names[i]);
    assert(w > 0 && (size_t)w < sizeof list - used);
    used += (size_t)w;
  }
  return fault_error(ctx, "unknown %s '%s' (%s)", params[p].name, value,
                     list);
}

/* Store one parameter's value into f.  value is NULL for flags. */
static int param_value(const parse_ctx *ctx, sl_fault *f, enum param_id p,
                       const char *value) {
  uint64_t v = 0;
  int rc = 0, index = 0;
  switch (p) {
  case P_OP:
    return op_value(ctx, value, f);
  case P_INSTANCE:
    rc = number_value(ctx, p, value, 0, SL_MAX_PARALLELISM - 1, &v);
    f->instance = (int)v;
    return rc;
  case P_RECORD:
    return number_value(ctx, p, value, 1, UINT64_MAX, &f->record);
  case P_PROB:
    if ((rc = prob_value(ctx, value, &f->prob)) != 0)
      return rc;
    /* fire when a 53-bit draw is below prob * 2^53; at least 1 so that a
     * tiny positive prob is not silently "never" */
    f->prob_threshold = (uint64_t)(f->prob * 9007199254740992.0);
    if (f->prob_threshold == 0)
      f->prob_threshold = 1;
    return 0;
  case P_SEED:
    return number_value(ctx, p, value, 0, UINT64_MAX, &f->seed);
  case P_TIMES:
    if (strcmp(value, "inf") == 0) {
      f->times = SL_FAULT_TIMES_INF;
      return 0;
    }
    if (parse_u64(value, &v) == NUMBER_SYNTAX)
      return fault_error(ctx, "bad times '%s': not a decimal number or 'inf'",
                         value);
    return number_value(ctx, p, value, 1, UINT64_MAX, &f->times);
  case P_NTH:
    return number_value(ctx, p, value, 1, UINT64_MAX, &f->nth);
  case P_CALL:
    rc = name_value(ctx, p, value, call_names, CALL_COUNT, &index);
    f->call = (enum sl_fault_call)index;
    return rc;
  case P_ERROR: {
    const char *names[ERROR_COUNT];
    for (int i = 0; i < ERROR_COUNT; i++)
      names[i] = errors[i].name;
    rc = name_value(ctx, p, value, names, ERROR_COUNT, &index);
    f->error = errors[index].error;
    return rc;
  }
  case P_DELAY_US:
    rc = number_value(ctx, p, value, 1, SL_FAULT_DELAY_US_MAX, &v);
    f->delay_us = (uint32_t)v;
    return rc;
  case P_FROM:
    return number_value(ctx, p, value, 1, UINT64_MAX, &f->from);
  case P_RECORDS:
    return number_value(ctx, p, value, 1, UINT64_MAX, &f->records);
  case P_POINT:
    rc = name_value(ctx, p, value, point_names, POINT_COUNT, &index);
    f->point = (enum sl_fault_point)index;
    return rc;
  case P_PERSISTENT:
    f->times = SL_FAULT_TIMES_INF;
    return 0;
  case P_TRANSIENT:
    f->times = 1;
    return 0;
  case P_COUNT:
    break;
  }
  assert(!"unreachable: every parameter has a case");
  return EINVAL;
}

/* ------------------------------------------------------------ faults */

static void fault_defaults(sl_fault *f) {
  memset(f, 0, sizeof *f);
  f->instance = -1;
  f->seed = 1;
  f->nth = 1;
  f->times = 1;
  f->error = EIO;
  f->from = 1;
  f->records = UINT64_MAX;
  atomic_init(&f->occurrences, 0);
  atomic_init(&f->fired, 0);
}

/* Parameters that all set `times`: only one of them may appear. */
#define TIMES_GROUP (BIT(P_TIMES) | BIT(P_PERSISTENT) | BIT(P_TRANSIENT))

/* Check one "NAME=VALUE" or "FLAG" token (trimmed, non-empty) and store
 * it.  *seen collects the parameters met so far in this fault. */
static int parse_param(const parse_ctx *ctx, sl_fault *f, char *token,
                       uint32_t *seen) {
  char *eq = strchr(token, '=');
  char *name = token, *value = NULL;
  if (eq) {
    *eq = 0;
    name = trim(token);
    value = trim(eq + 1);
    if (!*name)
      return fault_error(ctx, "no parameter name before '=%s'", value);
  }
  uint32_t allowed = kinds[f->kind].allowed;
  char list[160]; /* longest list: fail's six names, ~40 bytes */
  list_params(allowed, list, sizeof list);
  int p = 0;
  while (p < P_COUNT && strcmp(params[p].name, name) != 0)
    p++;
  if (p == P_COUNT)
    return fault_error(ctx, "unknown parameter '%s' (%s takes %s)", name,
                       kinds[f->kind].name, list);
  if (!(allowed & BIT(p)))
    return fault_error(ctx, "parameter '%s' does not apply to %s (it takes %s)",
                       name, kinds[f->kind].name, list);
  if (*seen & BIT(p))
    return fault_error(ctx, "parameter '%s' given twice", name);
  if ((TIMES_GROUP & BIT(p)) && (*seen & TIMES_GROUP)) {
    int earlier = 0;
    while (!(*seen & TIMES_GROUP & BIT(earlier)))
      earlier++;
    return fault_error(ctx, "'%s' conflicts with '%s': both set times", name,
                       params[earlier].name);
  }
  *seen |= BIT(p);
  if (params[p].flag && value)
    return fault_error(ctx, "'%s' is a flag and takes no value (got '%s')",
                       name, value);
  if (!params[p].flag && !value)
    return fault_error(ctx, "parameter '%s' needs a value (%s)", name,
                       params[p].hint);
  if (!params[p].flag && !*value)
    return fault_error(ctx, "parameter '%s' has an empty value (%s)", name,
                       params[p].hint);
  return param_value(ctx, f, (enum param_id)p, value);
}

/* The rules between parameters, once all are in. */
static int check_required(const parse_ctx *ctx, const sl_fault *f,
                          uint32_t seen) {
  const char *kind = kinds[f->kind].name;
  switch (f->kind) {
  case SL_FAULT_FAIL:
    if ((seen & BIT(P_RECORD)) && (seen & BIT(P_PROB)))
      return fault_error(ctx, "fail takes record=N or prob=P, not both");
    if (!(seen & (BIT(P_RECORD) | BIT(P_PROB))))
      return fault_error(ctx, "fail needs record=N or prob=P");
    if ((seen & BIT(P_SEED)) && !(seen & BIT(P_PROB)))
      return fault_error(ctx, "seed applies only with prob");
    return 0;
  case SL_FAULT_STORE:
    if (!(seen & BIT(P_CALL)))
      return fault_error(ctx, "%s needs %s", kind, params[P_CALL].hint);
    return 0;
  case SL_FAULT_SLOW:
    if (!(seen & BIT(P_DELAY_US)))
      return fault_error(ctx, "%s needs %s (1..%u)", kind,
                         params[P_DELAY_US].hint, SL_FAULT_DELAY_US_MAX);
    return 0;
  case SL_FAULT_CRASH:
    if (!(seen & BIT(P_POINT)))
      return fault_error(ctx, "%s needs %s", kind, params[P_POINT].hint);
    return 0;
  case SL_FAULT_SNAPSHOT:
  case SL_FAULT_WRITE:
  case SL_FAULT_RESTORE:
  case SL_FAULT_COMPLETE:
    return 0;
  }
  assert(!"unreachable: every kind has a case");
  return EINVAL;
}

/* Parse ctx->piece (trimmed, non-empty) into f. */
static int parse_fault(const parse_ctx *ctx, sl_fault *f) {
  assert(ctx->piece_bytes > 0);
  assert(!is_space(ctx->piece[0]));
  fault_defaults(f);
  if (ctx->piece_bytes >= SL_FAULT_TEXT_BYTES)
    return fault_error(ctx, "longer than %d bytes", SL_FAULT_TEXT_BYTES - 1);
  memcpy(f->text, ctx->piece, ctx->piece_bytes);
  f->text[ctx->piece_bytes] = 0;

  char scratch[SL_FAULT_TEXT_BYTES]; /* cut in place below */
  memcpy(scratch, f->text, ctx->piece_bytes + 1);
  char *colon = strchr(scratch, ':');
  if (colon)
    *colon = 0;
  const char *kind = trim(scratch);
  int k = 0;
  while (k < KIND_COUNT && strcmp(kinds[k].name, kind) != 0)
    k++;
  if (!*kind)
    return fault_error(ctx, "no kind before ':' (fail, snapshot, write, "
                            "restore, store, slow, crash or complete)");
  if (k == KIND_COUNT)
    return fault_error(ctx,
                       "unknown kind '%s' (fail, snapshot, write, restore, "
                       "store, slow, crash or complete)",
                       kind);
  f->kind = (enum sl_fault_kind)k;

  uint32_t seen = 0;
  if (colon) {
    char *rest = trim(colon + 1);
    if (!*rest)
      return fault_error(ctx, "no parameters after ':'");
    /* one token per ',': bounded by the text's length */
    for (int index = 1;; index++) {
      char *comma = strchr(rest, ',');
      if (comma)
        *comma = 0;
      char *token = trim(rest);
      if (!*token)
        return fault_error(ctx, "parameter %d is empty", index);
      int rc = parse_param(ctx, f, token, &seen);
      if (rc)
        return rc;
      if (!comma)
        break;
      rest = comma + 1;
    }
  }
  return check_required(ctx, f, seen);
}

/* The next piece of spec starting at *cursor: [*begin, *begin+*bytes),
 * trimmed, possibly empty.  Advances *cursor past the ';'.  Returns false
 * at the end of the spec. */
static bool next_piece(const char **cursor, const char **begin,
                       size_t *bytes) {
  const char *s = *cursor;
  if (!s)
    return false;
  const char *end = strchr(s, ';');
  const char *stop = end ? end : s + strlen(s);
  while (s < stop && is_space(*s))
    s++;
  while (stop > s && is_space(stop[-1]))
    stop--;
  *begin = s;
  *bytes = (size_t)(stop - s);
  *cursor = end ? end + 1 : NULL;
  return true;
}

static int count_faults(const char *spec) {
  int count = 0;
  const char *begin;
  size_t bytes;
  while (next_piece(&spec, &begin, &bytes))
    count += bytes > 0;
  return count;
}

/* ------------------------------------------------------------ plans */

int sl_fault_plan_parse(const char *spec, sl_fault_plan **out, char *err,
                        size_t err_bytes) {
  return sl_fault_plan_parse_many(&spec, NULL, 1, out, err, err_bytes);
}

int sl_fault_plan_parse_many(const char *const *specs,
                             const char *const *origins, int spec_count,
                             sl_fault_plan **out, char *err,
                             size_t err_bytes) {
  assert(out);
  assert(spec_count >= 0);
  assert(specs || spec_count == 0);
  *out = NULL;
  if (err && err_bytes > 0)
    err[0] = 0;
  int total = 0;
  for (int i = 0; i < spec_count; i++)
    if (specs[i])
      total += count_faults(specs[i]);
  if (total == 0)
    return 0;
  /* Room for the first SL_FAULT_MAX only: one more is an error anyway,
   * reported when the parser reaches it so earlier errors come first. */
  int capacity = total < SL_FAULT_MAX ? total : SL_FAULT_MAX;
  sl_fault_plan *plan =
      calloc(1, sizeof *plan + (size_t)capacity * sizeof(sl_fault));
  if (!plan)
    return ENOMEM;
  for (int i = 0; i < spec_count; i++) {
    parse_ctx ctx = {.err = err,
                     .err_bytes = err_bytes,
                     .origin = origins ? origins[i] : NULL};
    const char *cursor = specs[i];
    while (next_piece(&cursor, &ctx.piece, &ctx.piece_bytes)) {
      if (ctx.piece_bytes == 0)
        continue;
      ctx.index++;
      int rc = plan->count == SL_FAULT_MAX
                   ? fault_error(&ctx, "more than %d faults", SL_FAULT_MAX)
                   : parse_fault(&ctx, &plan->faults[plan->count]);
      if (rc) {
        free(plan);
        return rc;
      }
      plan->count++;
    }
  }
  assert(plan->count == capacity);
  *out = plan;
  return 0;
}

void sl_fault_plan_free(sl_fault_plan *plan) { free(plan); }

bool sl_fault_plan_has(const sl_fault_plan *plan, enum sl_fault_kind kind) {
  if (!plan)
    return false;
  for (int i = 0; i < plan->count; i++)
    if (plan->faults[i].kind == kind)
      return true;
  return false;
}

bool sl_fault_matches(const sl_fault *f, const char *op, int instance) {
  assert(instance >= -1 && instance < SL_MAX_PARALLELISM);
  if (f->op[0] && (!op || strcmp(f->op, op) != 0))
    return false;
  return f->instance < 0 || f->instance == instance;
}

/* ------------------------------------------------------------ firing */

/* Take one of f's times, if one is left (note 3).  Relaxed: the counter
 * only has to stay <= times (note 5). */
static bool claim(sl_fault *f) {
  uint64_t fired = atomic_load_explicit(&f->fired, memory_order_relaxed);
  while (fired < f->times)
    if (atomic_compare_exchange_weak_explicit(&f->fired, &fired, fired + 1,
                                              memory_order_relaxed,
                                              memory_order_relaxed))
      return true;
  return false;
}

static bool sub_matches(const sl_fault *f, int sub) {
  switch (f->kind) {
  case SL_FAULT_STORE:
    return (int)f->call == sub;
  case SL_FAULT_CRASH:
    return (int)f->point == sub;
  default:
    return true;
  }
}

sl_fault *sl_fault_occur(sl_fault_plan *plan, enum sl_fault_kind kind,
                         int sub, const char *op, int instance) {
  assert(kind != SL_FAULT_FAIL && kind != SL_FAULT_SLOW);
  assert((kind == SL_FAULT_STORE || kind == SL_FAULT_CRASH) ? sub >= 0
                                                            : sub == -1);
  if (!plan)
    return NULL;
  sl_fault *winner = NULL;
  for (int i = 0; i < plan->count; i++) {
    sl_fault *f = &plan->faults[i];
    if (f->kind != kind || !sub_matches(f, sub) ||
        !sl_fault_matches(f, op, instance))
      continue;
    /* Relaxed: the number only has to be unique (note 5). */
    uint64_t k = atomic_fetch_add_explicit(&f->occurrences, 1,
                                           memory_order_relaxed) + 1;
    /* k - nth < times rather than k < nth + times: no overflow with inf */
    if (!winner && k >= f->nth && k - f->nth < f->times) {
      atomic_fetch_add_explicit(&f->fired, 1, memory_order_relaxed);
      winner = f;
    }
  }
  return winner;
}

void sl_fault_unoccur(sl_fault_plan *plan, enum sl_fault_kind kind, int sub,
                      const char *op, int instance) {
  if (!plan)
    return;
  for (int i = 0; i < plan->count; i++) {
    sl_fault *f = &plan->faults[i];
    if (f->kind == kind && sub_matches(f, sub) &&
        sl_fault_matches(f, op, instance))
      atomic_fetch_sub_explicit(&f->occurrences, 1, memory_order_relaxed);
  }
}

void sl_fault_crash_check(sl_fault_plan *plan, enum sl_fault_point point) {
  sl_fault *f = sl_fault_occur(plan, SL_FAULT_CRASH, (int)point, NULL, -1);
  if (!f)
    return;
  /* a crash fault fires once (times is 1), at occurrence nth */
  sl_fault_log(f, "crash point %s, occurrence %llu", sl_fault_point_name(point),
               (unsigned long long)f->nth);
  raise(SIGKILL);
  abort(); /* not reached: SIGKILL cannot be caught */
}

/* ------------------------------------------------------------ cursors */

/* SplitMix64 (Steele, Lea, Flood 2014): a counter through a strong mixer,
 * so each state gives a well-spread word and seeds need no warm-up. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint64_t splitmix_next(uint64_t *state) {
  *state += 0x9e3779b97f4a7c15ull;
  return mix64(*state);
}

void sl_fault_cursor_init(sl_fault_cursor *c, sl_fault_plan *plan,
                          const char *op, int instance,
                          uint32_t stable_instance_number) {
  memset(c, 0, sizeof *c);
  if (!plan)
    return;
  assert(plan->count <= SL_FAULT_MAX);
  for (int i = 0; i < plan->count; i++) {
    sl_fault *f = &plan->faults[i];
    if ((f->kind != SL_FAULT_FAIL && f->kind != SL_FAULT_SLOW) ||
        !sl_fault_matches(f, op, instance))
      continue;
    /* The seed and the instance both go through the mixer, so seeds 1 and
     * 2 on instances 2 and 1 do not share a sequence. */
    c->rng_state[c->count] =
        mix64(mix64(f->seed) ^ (0x632be59bd9b4e019ull + stable_instance_number));
    c->faults[c->count++] = f;
  }
}

_Static_assert((uint64_t)SL_FAULT_MAX * SL_FAULT_DELAY_US_MAX <= UINT32_MAX,
               "the summed delay of one record fits step.delay_us");

sl_fault_step sl_fault_cursor_next(sl_fault_cursor *c) {
  assert(c->count > 0 && c->count <= SL_FAULT_MAX);
  sl_fault_step step = {0};
  uint64_t n = ++c->record;
  for (int i = 0; i < c->count; i++) {
    sl_fault *f = c->faults[i];
    if (f->kind == SL_FAULT_FAIL) {
      bool due;
      if (f->prob > 0) /* one draw per record, used or not (note 4) */
        due = splitmix_next(&c->rng_state[i]) >> 11 < f->prob_threshold;
      else
        due = n == f->record;
      if (due) {
        atomic_fetch_add_explicit(&f->occurrences, 1, memory_order_relaxed);
        if (!step.fail && claim(f))
          step.fail = f;
      }
    } else {
      assert(f->kind == SL_FAULT_SLOW);
      if (n >= f->from && n - f->from < f->records) {
        step.delay_us += f->delay_us; /* <= SL_FAULT_MAX * 10 s: fits */
        atomic_fetch_add_explicit(&f->fired, 1, memory_order_relaxed);
        if (n == f->from && !step.slow_begins)
          step.slow_begins = f;
      }
    }
  }
  return step;
}

void sl_fault_cursor_restart(sl_fault_cursor *c) { c->record = 0; }

/* ------------------------------------------------------------ text */

int sl_fault_describe(const sl_fault *f, char *buf, size_t n) {
  return snprintf(buf, n, "injected fault '%s'", f->text);
}

void sl_fault_log(const sl_fault *f, const char *detail_fmt, ...) {
  char line[512];
  int used = snprintf(line, sizeof line, "sluice: injecting fault '%s'",
                      f->text);
  assert(used > 0 && (size_t)used < sizeof line); /* text < 256 bytes */
  if (detail_fmt) {
    used += snprintf(line + used, sizeof line - (size_t)used, " (");
    va_list ap;
    va_start(ap, detail_fmt);
    int w = vsnprintf(line + used, sizeof line - (size_t)used, detail_fmt, ap);
    va_end(ap);
    if (w > 0)
      used += w;
    if ((size_t)used > sizeof line - 3)
      used = (int)sizeof line - 3; /* cut: keep room for ")\n" and NUL */
    snprintf(line + used, sizeof line - (size_t)used, ")");
  }
  /* log.c writes the line with one write(2): lines of different threads
   * do not interleave. */
  sl_log(SL_LOG_INFO, "%s", line);
}
