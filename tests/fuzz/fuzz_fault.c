/* fuzz_fault.c — libFuzzer target: the fault-spec parser (engine/fault.c,
 * sl_fault_plan_parse_many), the syntax of --fault, SLUICE_FAULTS and the
 * job config (fault.h, SYNTAX).
 *
 * The input is up to MAX_SPECS specs, one per line (as --fault given
 * several times).  A plan it accepts must hold sane values; each fault's
 * own text must parse again to the same fault; and per-record cursors
 * over it step without crashing.  Crash faults are never fired: the
 * target checks them with sl_fault_occur, which only counts.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "fuzz_lines.h"

#define MAX_SPECS 8
#define CURSOR_STEPS 64 /* records stepped per cursor */

/* The fields a spec sets (not the counters). */
static int same_fault(const sl_fault *a, const sl_fault *b) {
  return a->kind == b->kind && strcmp(a->op, b->op) == 0 &&
         a->instance == b->instance && a->record == b->record &&
         a->prob == b->prob && a->prob_threshold == b->prob_threshold &&
         a->seed == b->seed && a->nth == b->nth && a->times == b->times &&
         a->call == b->call && a->error == b->error &&
         a->delay_us == b->delay_us && a->from == b->from &&
         a->records == b->records && a->point == b->point;
}

static void check_fault(const sl_fault *f) {
  FUZZ_CHECK(f->kind >= SL_FAULT_FAIL && f->kind <= SL_FAULT_COMPLETE);
  FUZZ_CHECK(memchr(f->op, 0, sizeof f->op) != 0);
  FUZZ_CHECK(f->instance >= -1 && f->instance < SL_MAX_PARALLELISM);
  FUZZ_CHECK(f->nth >= 1 && f->times >= 1);
  FUZZ_CHECK(f->kind != SL_FAULT_FAIL || (f->record > 0) != (f->prob > 0));
  FUZZ_CHECK(f->prob >= 0 && f->prob <= 1);
  char text[SL_FAULT_TEXT_BYTES + 64];
  FUZZ_CHECK(sl_fault_describe(f, text, sizeof text) >= 0);
  /* Its own text is a spec that gives the same fault. */
  sl_fault_plan *again = 0;
  char err[512];
  int rc = sl_fault_plan_parse(f->text, &again, err, sizeof err);
  if (rc != 0)
    fprintf(stderr, "'%s' parsed once, then: %s\n", f->text, err);
  FUZZ_CHECK(rc == 0 && again && again->count == 1);
  FUZZ_CHECK(same_fault(f, &again->faults[0]));
  sl_fault_plan_free(again);
}

static void step_cursors(sl_fault_plan *plan) {
  for (int i = 0; i < plan->count; i++) {
    const sl_fault *f = &plan->faults[i];
    sl_fault_cursor c;
    sl_fault_cursor_init(&c, plan, f->op[0] ? f->op : "op",
                         f->instance >= 0 ? f->instance : 0,
                         (uint32_t)i);
    for (int k = 0; k < CURSOR_STEPS && sl_fault_cursor_active(&c); k++)
      (void)sl_fault_cursor_next(&c);
    sl_fault_cursor_restart(&c);
    if (f->kind == SL_FAULT_STORE)
      (void)sl_fault_occur(plan, f->kind, (int)f->call, 0, -1);
    else if (f->kind == SL_FAULT_CRASH)
      (void)sl_fault_occur(plan, f->kind, (int)f->point, 0, -1);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text)
    abort();
  memcpy(text, data, size);
  text[size] = 0; /* a C string: it ends at its first NUL */
  const char *specs[MAX_SPECS];
  const char *origins[MAX_SPECS] = {"config", "SLUICE_FAULTS", "--fault 1",
                                    "--fault 2", "--fault 3", "--fault 4",
                                    "--fault 5", "--fault 6"};
  int count = 0;
  for (char *line = text; line && count < MAX_SPECS; count++) {
    specs[count] = line;
    line = strchr(line, '\n');
    if (line)
      *line++ = 0;
  }
  sl_fault_plan *plan = 0;
  char err[512] = "";
  int rc = sl_fault_plan_parse_many(specs, origins, count, &plan, err,
                                    sizeof err);
  FUZZ_CHECK(rc == 0 || rc == EINVAL || rc == ENOMEM);
  FUZZ_CHECK(memchr(err, 0, sizeof err) != 0);
  if (rc == EINVAL)
    FUZZ_CHECK(err[0] != 0 && plan == 0);
  if (rc == 0 && plan) {
    FUZZ_CHECK(plan->count >= 1 && plan->count <= SL_FAULT_MAX);
    for (int i = 0; i < plan->count; i++)
      check_fault(&plan->faults[i]);
    step_cursors(plan);
  }
  sl_fault_plan_free(plan);
  free(text);
  return 0;
}
