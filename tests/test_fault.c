/* test_fault.c — Criterion tests of the fault-injection spec and its firing
 * decisions (engine/fault.h).
 *
 * Parsing: every kind with every parameter and with its defaults,
 * whitespace, several faults and several specs; then every class of error,
 * each checked against the exact message, so a test also pins which fault
 * (index, text) and which token the message names.
 *
 * Firing: occurrence windows (nth .. nth+times-1) from one thread and from
 * many (the total must be exactly times), and per-record cursors: record=N
 * hits record N of each (re)start, prob draws are a pure function of seed,
 * instance and record index (restarts do not rewind them), the rate of a
 * prob fault over 1e6 records is within loose bounds, slow delays the
 * right records.  Nothing here measures time.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"

#define ERR_BYTES 512

/* ------------------------------------------------------------ helpers */

/* Parse spec, which must be valid and hold `count` faults. */
static sl_fault_plan *parse_ok(const char *spec, int count) {
  sl_fault_plan *plan = (sl_fault_plan *)1; /* must be overwritten */
  char err[ERR_BYTES] = "untouched";
  int rc = sl_fault_plan_parse(spec, &plan, err, sizeof err);
  cr_assert_eq(rc, 0, "'%s': rc %d: %s", spec, rc, err);
  cr_assert_str_empty(err, "'%s': error text '%s' on success", spec, err);
  cr_assert_not_null(plan, "'%s': no plan", spec);
  cr_assert_eq(plan->count, count, "'%s': %d faults, expected %d", spec,
               plan->count, count);
  return plan;
}

/* Parse a spec with exactly one fault and return a copy of it. */
static sl_fault parse_one(const char *spec) {
  sl_fault_plan *plan = parse_ok(spec, 1);
  sl_fault f;
  memcpy(&f, &plan->faults[0], sizeof f);
  sl_fault_plan_free(plan);
  return f;
}

/* spec must be refused with EINVAL and exactly this message. */
static void parse_fails(const char *spec, const char *message) {
  sl_fault_plan *plan = (sl_fault_plan *)1;
  char err[ERR_BYTES] = "";
  int rc = sl_fault_plan_parse(spec, &plan, err, sizeof err);
  cr_assert_eq(rc, EINVAL, "'%s': rc %d, expected EINVAL", spec, rc);
  cr_assert_null(plan, "'%s': a plan came back with the error", spec);
  cr_assert_str_eq(err, message, "'%s':\n got      %s\n expected %s", spec,
                   err, message);
}

static uint64_t loaded(_Atomic uint64_t *counter) { return atomic_load(counter); }

/* ------------------------------------------------------------ parsing */

TestSuite(parse, .timeout = 30);

Test(parse, no_faults_gives_no_plan) {
  const char *specs[] = {NULL, "", "   ", ";", " ; ;;\t; ", "\n"};
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
    sl_fault_plan *plan = (sl_fault_plan *)1;
    char err[ERR_BYTES] = "x";
    cr_assert_eq(sl_fault_plan_parse(specs[i], &plan, err, sizeof err), 0);
    cr_assert_null(plan, "spec %zu gave a plan", i);
    cr_assert_str_empty(err);
  }
}

Test(parse, fail_with_record_every_parameter) {
  sl_fault f = parse_one("fail:op=count,instance=3,record=5000,times=2");
  cr_assert_eq(f.kind, SL_FAULT_FAIL);
  cr_assert_str_eq(f.text, "fail:op=count,instance=3,record=5000,times=2");
  cr_assert_str_eq(f.op, "count");
  cr_assert_eq(f.instance, 3);
  cr_assert_eq(f.record, 5000);
  cr_assert_eq(f.prob, 0.0);
  cr_assert_eq(f.times, 2);
  cr_assert_eq(loaded(&f.occurrences), 0);
  cr_assert_eq(loaded(&f.fired), 0);
}

Test(parse, fail_with_prob_every_parameter) {
  sl_fault f = parse_one("fail:op=map-1,instance=0,prob=0.25,seed=42,times=inf");
  cr_assert_eq(f.kind, SL_FAULT_FAIL);
  cr_assert_str_eq(f.op, "map-1");
  cr_assert_eq(f.instance, 0);
  cr_assert_eq(f.record, 0);
  cr_assert_float_eq(f.prob, 0.25, 1e-15);
  cr_assert_eq(f.prob_threshold, 1ull << 51, "0.25 * 2^53");
  cr_assert_eq(f.seed, 42);
  cr_assert_eq(f.times, SL_FAULT_TIMES_INF);
}

Test(parse, fail_defaults) {
  sl_fault f = parse_one("fail:record=1");
  cr_assert_str_eq(f.op, "");
  cr_assert_eq(f.instance, -1);
  cr_assert_eq(f.record, 1);
  cr_assert_eq(f.times, 1);
  f = parse_one("fail:prob=1");
  cr_assert_eq(f.seed, 1);
  cr_assert_eq(f.prob, 1.0);
  cr_assert_eq(f.prob_threshold, 1ull << 53);
  cr_assert_eq(f.times, 1);
}

Test(parse, prob_forms) {
  cr_assert_float_eq(parse_one("fail:prob=.5").prob, 0.5, 1e-15);
  cr_assert_eq(parse_one("fail:prob=1.").prob, 1.0);
  cr_assert_eq(parse_one("fail:prob=1.000").prob, 1.0);
  cr_assert_eq(parse_one("fail:prob=0001").prob, 1.0);
  cr_assert_float_eq(parse_one("fail:prob=0.001").prob, 0.001, 1e-15);
  /* far below 2^-53: still fires sometimes, never "never" */
  sl_fault f = parse_one("fail:prob=0.00000000000000000000000001");
  cr_assert_gt(f.prob, 0.0);
  cr_assert_eq(f.prob_threshold, 1);
}

Test(parse, snapshot_every_parameter_and_defaults) {
  sl_fault f = parse_one("snapshot:op=window,instance=255,nth=3,times=4");
  cr_assert_eq(f.kind, SL_FAULT_SNAPSHOT);
  cr_assert_str_eq(f.op, "window");
  cr_assert_eq(f.instance, 255);
  cr_assert_eq(f.nth, 3);
  cr_assert_eq(f.times, 4);
  f = parse_one("snapshot");
  cr_assert_eq(f.kind, SL_FAULT_SNAPSHOT);
  cr_assert_str_eq(f.op, "");
  cr_assert_eq(f.instance, -1);
  cr_assert_eq(f.nth, 1);
  cr_assert_eq(f.times, 1);
}

Test(parse, write_every_parameter_and_defaults) {
  sl_fault f = parse_one("write:nth=2,times=inf");
  cr_assert_eq(f.kind, SL_FAULT_WRITE);
  cr_assert_eq(f.nth, 2);
  cr_assert_eq(f.times, SL_FAULT_TIMES_INF);
  f = parse_one("write");
  cr_assert_eq(f.nth, 1);
  cr_assert_eq(f.times, 1);
}

Test(parse, restore_every_parameter_and_defaults) {
  sl_fault f = parse_one("restore:op=sink,instance=7,nth=5,times=6");
  cr_assert_eq(f.kind, SL_FAULT_RESTORE);
  cr_assert_str_eq(f.op, "sink");
  cr_assert_eq(f.instance, 7);
  cr_assert_eq(f.nth, 5);
  cr_assert_eq(f.times, 6);
  f = parse_one("restore");
  cr_assert_eq(f.instance, -1);
  cr_assert_eq(f.nth, 1);
  cr_assert_eq(f.times, 1);
}

Test(parse, store_every_parameter) {
  sl_fault f = parse_one("store:call=put,error=EIO,nth=9,times=3");
  cr_assert_eq(f.kind, SL_FAULT_STORE);
  cr_assert_eq(f.call, SL_FAULT_CALL_PUT);
  cr_assert_eq(f.error, EIO);
  cr_assert_eq(f.nth, 9);
  cr_assert_eq(f.times, 3);
  f = parse_one("store:call=commit,error=ENOSPC,persistent");
  cr_assert_eq(f.call, SL_FAULT_CALL_COMMIT);
  cr_assert_eq(f.error, ENOSPC);
  cr_assert_eq(f.times, SL_FAULT_TIMES_INF);
  f = parse_one("store:call=sync,error=MAP_FULL,transient");
  cr_assert_eq(f.call, SL_FAULT_CALL_SYNC);
  cr_assert_eq(f.error, MDB_MAP_FULL);
  cr_assert_eq(f.error, -30792);
  cr_assert_eq(f.times, 1);
}

Test(parse, store_defaults) {
  sl_fault f = parse_one("store:call=commit");
  cr_assert_eq(f.error, EIO);
  cr_assert_eq(f.nth, 1);
  cr_assert_eq(f.times, 1);
}

Test(parse, slow_every_parameter_and_defaults) {
  sl_fault f =
      parse_one("slow:op=sink,instance=1,delay_us=2000,from=100,records=50");
  cr_assert_eq(f.kind, SL_FAULT_SLOW);
  cr_assert_str_eq(f.op, "sink");
  cr_assert_eq(f.instance, 1);
  cr_assert_eq(f.delay_us, 2000);
  cr_assert_eq(f.from, 100);
  cr_assert_eq(f.records, 50);
  f = parse_one("slow:delay_us=1");
  cr_assert_eq(f.delay_us, 1);
  cr_assert_eq(f.from, 1);
  cr_assert_eq(f.records, UINT64_MAX);
  cr_assert_eq(f.instance, -1);
  cr_assert_str_eq(f.op, "");
}

Test(parse, crash_every_point) {
  static const struct {
    const char *spec;
    enum sl_fault_point point;
  } cases[] = {
      {"crash:point=mid-write", SL_CRASH_MID_WRITE},
      {"crash:point=after-commit", SL_CRASH_AFTER_COMMIT},
      {"crash:point=sink-commit", SL_CRASH_SINK_COMMIT},
      {"crash:point=snapshot", SL_CRASH_SNAPSHOT},
      {"crash:point=after-restore", SL_CRASH_AFTER_RESTORE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sl_fault f = parse_one(cases[i].spec);
    cr_assert_eq(f.kind, SL_FAULT_CRASH);
    cr_assert_eq(f.point, cases[i].point, "%s", cases[i].spec);
    cr_assert_eq(f.nth, 1);
  }
  sl_fault f = parse_one("crash:point=after-commit,nth=12");
  cr_assert_eq(f.nth, 12);
}

Test(parse, largest_values_accepted) {
  sl_fault f = parse_one("fail:prob=0.5,seed=18446744073709551615,"
                         "times=18446744073709551615");
  cr_assert_eq(f.seed, UINT64_MAX);
  cr_assert_eq(f.times, UINT64_MAX);
  f = parse_one("fail:record=18446744073709551615,instance=255");
  cr_assert_eq(f.record, UINT64_MAX);
  cr_assert_eq(f.instance, 255);
  f = parse_one("slow:delay_us=10000000,from=18446744073709551615");
  cr_assert_eq(f.delay_us, 10000000);
  cr_assert_eq(f.from, UINT64_MAX);
  f = parse_one("fail:seed=0,prob=1");
  cr_assert_eq(f.seed, 0);
  /* the longest operator name the engine allows: SL_MAX_NAME - 1 bytes */
  char spec[128], name[SL_MAX_NAME];
  memset(name, 'n', SL_MAX_NAME - 1);
  name[SL_MAX_NAME - 1] = 0;
  snprintf(spec, sizeof spec, "snapshot:op=%s", name);
  f = parse_one(spec);
  cr_assert_str_eq(f.op, name);
  f = parse_one("fail:record=007");
  cr_assert_eq(f.record, 7);
}

Test(parse, whitespace_around_tokens) {
  sl_fault f = parse_one(" \t fail : op = count ,\tinstance= 2 , record =5 \n");
  cr_assert_str_eq(f.text, "fail : op = count ,\tinstance= 2 , record =5",
                   "text is trimmed, otherwise as written: '%s'", f.text);
  cr_assert_str_eq(f.op, "count");
  cr_assert_eq(f.instance, 2);
  cr_assert_eq(f.record, 5);
  f = parse_one("store : call = put , persistent ");
  cr_assert_eq(f.call, SL_FAULT_CALL_PUT);
  cr_assert_eq(f.times, SL_FAULT_TIMES_INF);
  f = parse_one("  write  ");
  cr_assert_eq(f.kind, SL_FAULT_WRITE);
  cr_assert_str_eq(f.text, "write");
}

Test(parse, several_faults_in_order) {
  sl_fault_plan *plan = parse_ok(
      ";fail:record=3; ;snapshot:nth=2;;write ;store:call=sync;"
      "slow:delay_us=5;crash:point=snapshot;restore;",
      7);
  static const enum sl_fault_kind expected[] = {
      SL_FAULT_FAIL,  SL_FAULT_SNAPSHOT, SL_FAULT_WRITE,  SL_FAULT_STORE,
      SL_FAULT_SLOW,  SL_FAULT_CRASH,    SL_FAULT_RESTORE};
  for (int i = 0; i < 7; i++)
    cr_assert_eq(plan->faults[i].kind, expected[i], "fault %d", i + 1);
  cr_assert_str_eq(plan->faults[1].text, "snapshot:nth=2");
  cr_assert_str_eq(plan->faults[2].text, "write");
  cr_assert(sl_fault_plan_has(plan, SL_FAULT_CRASH));
  sl_fault_plan_free(plan);
  plan = parse_ok("write;write:nth=2", 2);
  cr_assert(!sl_fault_plan_has(plan, SL_FAULT_FAIL));
  cr_assert(!sl_fault_plan_has(NULL, SL_FAULT_WRITE));
  sl_fault_plan_free(plan);
  sl_fault_plan_free(NULL);
}

Test(parse, many_specs_in_one_plan) {
  const char *specs[] = {"fail:record=1; write", NULL, "", "slow:delay_us=3",
                         "crash:point=mid-write"};
  const char *origins[] = {"config", "unused", "--fault 1", "--fault 2",
                           "SLUICE_FAULTS"};
  sl_fault_plan *plan = NULL;
  char err[ERR_BYTES];
  cr_assert_eq(sl_fault_plan_parse_many(specs, origins, 5, &plan, err,
                                        sizeof err),
               0, "%s", err);
  cr_assert_eq(plan->count, 4);
  cr_assert_eq(plan->faults[0].kind, SL_FAULT_FAIL);
  cr_assert_eq(plan->faults[1].kind, SL_FAULT_WRITE);
  cr_assert_eq(plan->faults[2].kind, SL_FAULT_SLOW);
  cr_assert_eq(plan->faults[3].kind, SL_FAULT_CRASH);
  sl_fault_plan_free(plan);
  /* nothing anywhere: no plan */
  const char *empty[] = {NULL, " ; "};
  plan = (sl_fault_plan *)1;
  cr_assert_eq(sl_fault_plan_parse_many(empty, NULL, 2, &plan, err, sizeof err),
               0);
  cr_assert_null(plan);
  cr_assert_eq(sl_fault_plan_parse_many(NULL, NULL, 0, &plan, err, sizeof err),
               0);
  cr_assert_null(plan);
}

/* ------------------------------------------------------------ parse errors */

TestSuite(parse_errors, .timeout = 30);

Test(parse_errors, unknown_or_missing_kind) {
  parse_fails("fial:record=5", "fault 1 ('fial:record=5'): unknown kind 'fial' "
                               "(fail, snapshot, write, restore, store, slow, "
                               "crash or complete)");
  parse_fails("write; Write", "fault 2 ('Write'): unknown kind 'Write' (fail, "
                              "snapshot, write, restore, store, slow, crash "
                              "or complete)");
  parse_fails("fa il", "fault 1 ('fa il'): unknown kind 'fa il' (fail, "
                       "snapshot, write, restore, store, slow, crash or "
                       "complete)");
  parse_fails(" : nth=1", "fault 1 (': nth=1'): no kind before ':' (fail, "
                          "snapshot, write, restore, store, slow, crash or "
                          "complete)");
}

Test(parse_errors, empty_parameters) {
  parse_fails("write:", "fault 1 ('write:'): no parameters after ':'");
  parse_fails("write:  ", "fault 1 ('write:'): no parameters after ':'");
  parse_fails("write:nth=1,,times=2",
              "fault 1 ('write:nth=1,,times=2'): parameter 2 is empty");
  parse_fails("write:nth=1, ",
              "fault 1 ('write:nth=1,'): parameter 2 is empty");
  parse_fails("write:,nth=1", "fault 1 ('write:,nth=1'): parameter 1 is empty");
  parse_fails("write:=3", "fault 1 ('write:=3'): no parameter name before '=3'");
}

Test(parse_errors, unknown_parameter) {
  parse_fails("fail:op=a,recrod=5",
              "fault 1 ('fail:op=a,recrod=5'): unknown parameter 'recrod' "
              "(fail takes op, instance, record, prob, seed, times)");
  parse_fails("crash:point=snapshot,when=now",
              "fault 1 ('crash:point=snapshot,when=now'): unknown parameter "
              "'when' (crash takes point, nth)");
  parse_fails("store:call=put,Persistent",
              "fault 1 ('store:call=put,Persistent'): unknown parameter "
              "'Persistent' (store takes call, error, nth, times, persistent, "
              "transient)");
}

Test(parse_errors, parameter_not_for_kind) {
  parse_fails("write:op=a", "fault 1 ('write:op=a'): parameter 'op' does not "
                            "apply to write (it takes nth, times)");
  parse_fails("fail:record=1,nth=2",
              "fault 1 ('fail:record=1,nth=2'): parameter 'nth' does not "
              "apply to fail (it takes op, instance, record, prob, seed, "
              "times)");
  parse_fails("slow:delay_us=5,times=2",
              "fault 1 ('slow:delay_us=5,times=2'): parameter 'times' does not "
              "apply to slow (it takes op, instance, delay_us, from, "
              "records)");
  parse_fails("snapshot:persistent",
              "fault 1 ('snapshot:persistent'): parameter 'persistent' does "
              "not apply to snapshot (it takes op, instance, nth, times)");
  parse_fails("restore:call=put",
              "fault 1 ('restore:call=put'): parameter 'call' does not apply "
              "to restore (it takes op, instance, nth, times)");
  parse_fails("crash:point=snapshot,times=2",
              "fault 1 ('crash:point=snapshot,times=2'): parameter 'times' "
              "does not apply to crash (it takes point, nth)");
  parse_fails("store:call=put,op=x",
              "fault 1 ('store:call=put,op=x'): parameter 'op' does not apply "
              "to store (it takes call, error, nth, times, persistent, "
              "transient)");
}

Test(parse_errors, repeated_parameter) {
  parse_fails("fail:op=a,record=1,op=b",
              "fault 1 ('fail:op=a,record=1,op=b'): parameter 'op' given "
              "twice");
  parse_fails("write:nth=1,nth=1",
              "fault 1 ('write:nth=1,nth=1'): parameter 'nth' given twice");
  parse_fails("store:call=put,persistent,persistent",
              "fault 1 ('store:call=put,persistent,persistent'): parameter "
              "'persistent' given twice");
}

Test(parse_errors, times_set_twice_another_way) {
  parse_fails("store:call=put,times=3,persistent",
              "fault 1 ('store:call=put,times=3,persistent'): 'persistent' "
              "conflicts with 'times': both set times");
  parse_fails("store:call=put,persistent,transient",
              "fault 1 ('store:call=put,persistent,transient'): 'transient' "
              "conflicts with 'persistent': both set times");
  parse_fails("store:call=put,transient,times=1",
              "fault 1 ('store:call=put,transient,times=1'): 'times' "
              "conflicts with 'transient': both set times");
}

Test(parse_errors, flags_and_values) {
  parse_fails("store:call=put,persistent=1",
              "fault 1 ('store:call=put,persistent=1'): 'persistent' is a "
              "flag and takes no value (got '1')");
  parse_fails("fail:op,record=1",
              "fault 1 ('fail:op,record=1'): parameter 'op' needs a value "
              "(op=NAME)");
  parse_fails("store:call", "fault 1 ('store:call'): parameter 'call' needs a "
                            "value (call=put|commit|sync)");
  parse_fails("write:times= ", "fault 1 ('write:times='): parameter 'times' "
                               "has an empty value (times=N|inf)");
}

Test(parse_errors, bad_numbers) {
  parse_fails("write:nth=12x",
              "fault 1 ('write:nth=12x'): bad nth '12x': not a decimal number");
  parse_fails("write:nth=-1",
              "fault 1 ('write:nth=-1'): bad nth '-1': not a decimal number");
  parse_fails("write:nth=+1",
              "fault 1 ('write:nth=+1'): bad nth '+1': not a decimal number");
  parse_fails("write:nth=0x10",
              "fault 1 ('write:nth=0x10'): bad nth '0x10': not a decimal "
              "number");
  parse_fails("write:nth=1e3",
              "fault 1 ('write:nth=1e3'): bad nth '1e3': not a decimal number");
  parse_fails("write:nth=1 2",
              "fault 1 ('write:nth=1 2'): bad nth '1 2': not a decimal number");
  parse_fails("fail:record=1,instance=two",
              "fault 1 ('fail:record=1,instance=two'): bad instance 'two': "
              "not a decimal number");
  parse_fails("write:times=infinity",
              "fault 1 ('write:times=infinity'): bad times 'infinity': not a "
              "decimal number or 'inf'");
  parse_fails("fail:prob=0.5,seed=-3",
              "fault 1 ('fail:prob=0.5,seed=-3'): bad seed '-3': not a decimal "
              "number");
}

Test(parse_errors, overflow) {
  parse_fails("write:nth=18446744073709551616",
              "fault 1 ('write:nth=18446744073709551616'): bad nth "
              "'18446744073709551616': larger than 18446744073709551615");
  parse_fails("fail:prob=0.1,seed=99999999999999999999999",
              "fault 1 ('fail:prob=0.1,seed=99999999999999999999999'): bad "
              "seed '99999999999999999999999': larger than "
              "18446744073709551615");
  parse_fails("write:times=18446744073709551616",
              "fault 1 ('write:times=18446744073709551616'): bad times "
              "'18446744073709551616': larger than 18446744073709551615");
  parse_fails("fail:record=1,instance=18446744073709551617",
              "fault 1 ('fail:record=1,instance=18446744073709551617'): bad "
              "instance '18446744073709551617': larger than "
              "18446744073709551615");
}

Test(parse_errors, out_of_range) {
  parse_fails("snapshot:instance=256",
              "fault 1 ('snapshot:instance=256'): bad instance '256': must be "
              "0..255");
  parse_fails("snapshot:nth=0",
              "fault 1 ('snapshot:nth=0'): bad nth '0': must be at least 1");
  parse_fails("snapshot:times=0",
              "fault 1 ('snapshot:times=0'): bad times '0': must be at least 1");
  parse_fails("fail:record=0",
              "fault 1 ('fail:record=0'): bad record '0': must be at least 1");
  parse_fails("slow:delay_us=5,from=0",
              "fault 1 ('slow:delay_us=5,from=0'): bad from '0': must be at "
              "least 1");
  parse_fails("slow:delay_us=5,records=0",
              "fault 1 ('slow:delay_us=5,records=0'): bad records '0': must "
              "be at least 1");
  parse_fails("slow:delay_us=0",
              "fault 1 ('slow:delay_us=0'): bad delay_us '0': must be "
              "1..10000000");
  parse_fails("slow:delay_us=10000001",
              "fault 1 ('slow:delay_us=10000001'): bad delay_us '10000001': "
              "must be 1..10000000");
}

Test(parse_errors, bad_prob) {
  parse_fails("fail:prob=0",
              "fault 1 ('fail:prob=0'): bad prob '0': must be above 0");
  parse_fails("fail:prob=0.000",
              "fault 1 ('fail:prob=0.000'): bad prob '0.000': must be above 0");
  parse_fails("fail:prob=1.5",
              "fault 1 ('fail:prob=1.5'): bad prob '1.5': must be at most 1");
  parse_fails("fail:prob=2",
              "fault 1 ('fail:prob=2'): bad prob '2': must be at most 1");
  /* a digit past double precision still counts */
  parse_fails("fail:prob=1.00000000000000000000001",
              "fault 1 ('fail:prob=1.00000000000000000000001'): bad prob "
              "'1.00000000000000000000001': must be at most 1");
  static const char *const syntax[] = {"abc", "0.5.5", "-0.5", ".", "1e-3",
                                       "0,5", "nan", "0x1p-3"};
  for (size_t i = 0; i < sizeof syntax / sizeof syntax[0]; i++) {
    char spec[64], message[256];
    snprintf(spec, sizeof spec, "fail:prob=%s", syntax[i]);
    /* "0,5" is cut at the ',' into prob=0 and a parameter '5' */
    if (strcmp(syntax[i], "0,5") == 0)
      snprintf(message, sizeof message,
               "fault 1 ('%s'): bad prob '0': must be above 0", spec);
    else
      snprintf(message, sizeof message,
               "fault 1 ('%s'): bad prob '%s': not a decimal fraction (like "
               "0.001)",
               spec, syntax[i]);
    parse_fails(spec, message);
  }
}

Test(parse_errors, bad_operator_names) {
  char spec[128], message[384], name[SL_MAX_NAME + 1];
  memset(name, 'n', SL_MAX_NAME);
  name[SL_MAX_NAME] = 0;
  snprintf(spec, sizeof spec, "fail:record=1,op=%s", name);
  snprintf(message, sizeof message,
           "fault 1 ('%s'): bad op '%s': an operator name has at most 47 "
           "bytes",
           spec, name);
  parse_fails(spec, message);
  parse_fails("fail:record=1,op=a b",
              "fault 1 ('fail:record=1,op=a b'): bad op 'a b': an operator "
              "name here cannot hold ',' ';' '=' ':' or whitespace");
  parse_fails("fail:record=1,op=a=b",
              "fault 1 ('fail:record=1,op=a=b'): bad op 'a=b': an operator "
              "name here cannot hold ',' ';' '=' ':' or whitespace");
  parse_fails("fail:record=1,op=a:b",
              "fault 1 ('fail:record=1,op=a:b'): bad op 'a:b': an operator "
              "name here cannot hold ',' ';' '=' ':' or whitespace");
}

Test(parse_errors, unknown_names) {
  parse_fails("write; store:call=put,error=EBADF",
              "fault 2 ('store:call=put,error=EBADF'): unknown error 'EBADF' "
              "(EIO, ENOSPC or MAP_FULL)");
  parse_fails("store:call=get",
              "fault 1 ('store:call=get'): unknown call 'get' (put, commit or "
              "sync)");
  parse_fails("store:call=PUT",
              "fault 1 ('store:call=PUT'): unknown call 'PUT' (put, commit or "
              "sync)");
  parse_fails("crash:point=mid_write",
              "fault 1 ('crash:point=mid_write'): unknown point 'mid_write' "
              "(mid-write, after-commit, sink-commit, snapshot or "
              "after-restore)");
}

Test(parse_errors, missing_required) {
  parse_fails("store", "fault 1 ('store'): store needs call=put|commit|sync");
  parse_fails("store:error=ENOSPC,persistent",
              "fault 1 ('store:error=ENOSPC,persistent'): store needs "
              "call=put|commit|sync");
  parse_fails("slow:op=a", "fault 1 ('slow:op=a'): slow needs delay_us=D "
                           "(1..10000000)");
  parse_fails("crash:nth=2", "fault 1 ('crash:nth=2'): crash needs "
                             "point=mid-write|after-commit|sink-commit|"
                             "snapshot|after-restore");
  parse_fails("fail", "fault 1 ('fail'): fail needs record=N or prob=P");
  parse_fails("fail:op=a,times=inf",
              "fault 1 ('fail:op=a,times=inf'): fail needs record=N or prob=P");
}

Test(parse_errors, fail_record_and_prob_rules) {
  parse_fails("fail:record=5,prob=0.5",
              "fault 1 ('fail:record=5,prob=0.5'): fail takes record=N or "
              "prob=P, not both");
  parse_fails("fail:record=5,seed=3",
              "fault 1 ('fail:record=5,seed=3'): seed applies only with prob");
}

Test(parse_errors, the_index_names_the_right_fault) {
  parse_fails("write;;  snapshot:nth=2 ; restore:nth=x ; write",
              "fault 3 ('restore:nth=x'): bad nth 'x': not a decimal number");
  /* the first error wins, even before a later one */
  parse_fails("write:nth=0; write:nth=y",
              "fault 1 ('write:nth=0'): bad nth '0': must be at least 1");
}

Test(parse_errors, text_too_long) {
  char spec[400];
  int n = snprintf(spec, sizeof spec, "fail:record=1,op=%s", "a");
  memset(spec + n, ' ', 300); /* spaces then one more parameter */
  strcpy(spec + n + 300, ",times=2");
  char message[ERR_BYTES];
  snprintf(message, sizeof message,
           "fault 1 ('%.80s...'): longer than 255 bytes", spec);
  parse_fails(spec, message);
}

Test(parse_errors, too_many_faults) {
  char spec[1024] = "";
  for (int i = 0; i < SL_FAULT_MAX; i++)
    strcat(spec, "write;");
  sl_fault_plan *plan = parse_ok(spec, SL_FAULT_MAX);
  sl_fault_plan_free(plan);
  strcat(spec, " write:nth=4 ");
  char message[ERR_BYTES];
  snprintf(message, sizeof message,
           "fault %d ('write:nth=4'): more than %d faults", SL_FAULT_MAX + 1,
           SL_FAULT_MAX);
  parse_fails(spec, message);
}

Test(parse_errors, origin_prefixes_the_message) {
  const char *specs[] = {"write", "slow:delay_us=1; store:call=put,error=EBADF"};
  const char *origins[] = {"config", "SLUICE_FAULTS"};
  sl_fault_plan *plan = (sl_fault_plan *)1;
  char err[ERR_BYTES];
  cr_assert_eq(
      sl_fault_plan_parse_many(specs, origins, 2, &plan, err, sizeof err),
      EINVAL);
  cr_assert_null(plan);
  cr_assert_str_eq(err, "SLUICE_FAULTS: fault 2 ('store:call=put,error="
                        "EBADF'): unknown error 'EBADF' (EIO, ENOSPC or "
                        "MAP_FULL)");
  /* the limit is for all specs together */
  char many[512] = "";
  for (int i = 0; i < SL_FAULT_MAX; i++)
    strcat(many, "write;");
  const char *two[] = {many, "crash:point=snapshot"};
  const char *names[] = {"config", "--fault 1"};
  cr_assert_eq(sl_fault_plan_parse_many(two, names, 2, &plan, err, sizeof err),
               EINVAL);
  cr_assert_str_eq(err, "--fault 1: fault 1 ('crash:point=snapshot'): more "
                        "than 32 faults");
}

Test(parse_errors, small_error_buffer) {
  char err[24];
  memset(err, 'x', sizeof err);
  sl_fault_plan *plan = NULL;
  cr_assert_eq(sl_fault_plan_parse("store:call=put,error=EBADF", &plan, err,
                                   sizeof err),
               EINVAL);
  cr_assert_str_eq(err, "fault 1 ('store:call=pu", "cut, NUL-terminated");
  /* no buffer at all */
  cr_assert_eq(sl_fault_plan_parse("bad", &plan, NULL, 0), EINVAL);
  cr_assert_null(plan);
}

/* ------------------------------------------------------------ occurrences */

TestSuite(occur, .timeout = 60);

/* Which of occurrences 1..n of a write fire, as a bit mask. */
static uint64_t fired_mask(sl_fault_plan *plan, int n) {
  uint64_t mask = 0;
  for (int k = 1; k <= n; k++)
    if (sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1))
      mask |= 1ull << k;
  return mask;
}

Test(occur, nth_and_times_window) {
  sl_fault_plan *plan = parse_ok("write:nth=3,times=2", 1);
  cr_assert_eq(fired_mask(plan, 20), (1ull << 3) | (1ull << 4));
  cr_assert_eq(loaded(&plan->faults[0].occurrences), 20);
  cr_assert_eq(loaded(&plan->faults[0].fired), 2);
  sl_fault_plan_free(plan);
  plan = parse_ok("write", 1);
  cr_assert_eq(fired_mask(plan, 20), 1ull << 1, "default: first only");
  sl_fault_plan_free(plan);
}

Test(occur, persistent_and_inf_fire_from_nth_on) {
  sl_fault_plan *plan = parse_ok("store:call=sync,nth=5,persistent", 1);
  for (int k = 1; k <= 1000; k++) {
    sl_fault *f = sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_SYNC,
                                 NULL, -1);
    cr_assert_eq(f != NULL, k >= 5, "occurrence %d", k);
  }
  cr_assert_eq(loaded(&plan->faults[0].fired), 996);
  sl_fault_plan_free(plan);
  plan = parse_ok("write:nth=2,times=inf", 1);
  cr_assert_eq(fired_mask(plan, 63), ~0ull << 2 & ~1ull);
  sl_fault_plan_free(plan);
  plan = parse_ok("store:call=put,transient,nth=2", 1);
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_PUT, 0, -1));
  cr_assert_not_null(
      sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_PUT, 0, -1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_PUT, 0, -1));
  sl_fault_plan_free(plan);
}

Test(occur, only_matching_events_count) {
  sl_fault_plan *plan =
      parse_ok("snapshot:op=window,instance=2,nth=2; store:call=commit;"
               "crash:point=after-commit,nth=2; restore:op=sink",
               4);
  sl_fault *snap = &plan->faults[0], *store = &plan->faults[1];
  sl_fault *crash = &plan->faults[2], *restore = &plan->faults[3];
  /* other operators, instances, calls, points and kinds do not count */
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_SNAPSHOT, -1, "count", 2));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_SNAPSHOT, -1, "window", 1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_SNAPSHOT, -1, NULL, -1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_RESTORE, -1, "window", 2));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_PUT, 0, -1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_SYNC, 0, -1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_CRASH, SL_CRASH_MID_WRITE, 0, -1));
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1));
  cr_assert_eq(loaded(&snap->occurrences), 0);
  cr_assert_eq(loaded(&store->occurrences), 0);
  cr_assert_eq(loaded(&crash->occurrences), 0);
  cr_assert_eq(loaded(&restore->occurrences), 0);
  /* matching events count and fire at nth */
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_SNAPSHOT, -1, "window", 2));
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_SNAPSHOT, -1, "window", 2), snap);
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_STORE, SL_FAULT_CALL_COMMIT, 0, -1),
               store);
  cr_assert_null(
      sl_fault_occur(plan, SL_FAULT_CRASH, SL_CRASH_AFTER_COMMIT, 0, -1));
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_CRASH, SL_CRASH_AFTER_COMMIT, 0, -1),
               crash);
  /* restore without instance: any instance of 'sink' */
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_RESTORE, -1, "sink", 5), restore);
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_RESTORE, -1, "sink", 0));
  sl_fault_plan_free(plan);
  cr_assert_null(sl_fault_occur(NULL, SL_FAULT_WRITE, -1, NULL, -1));
}

Test(occur, first_fault_wins_the_others_still_count) {
  sl_fault_plan *plan = parse_ok("write:nth=2; write:nth=1,times=3", 2);
  sl_fault *a = &plan->faults[0], *b = &plan->faults[1];
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1), b);
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1), a,
               "both fire at 2: the first in the plan wins");
  cr_assert_eq(sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1), b);
  cr_assert_null(sl_fault_occur(plan, SL_FAULT_WRITE, -1, NULL, -1),
                 "b's window 1..3 has passed: it lost occurrence 2 to a");
  cr_assert_eq(loaded(&a->fired), 1);
  cr_assert_eq(loaded(&b->fired), 2);
  cr_assert_eq(loaded(&a->occurrences), 4);
  cr_assert_eq(loaded(&b->occurrences), 4);
  sl_fault_plan_free(plan);
}

Test(occur, matches) {
  sl_fault f = parse_one("snapshot:op=window,instance=3");
  cr_assert(sl_fault_matches(&f, "window", 3));
  cr_assert(!sl_fault_matches(&f, "window", 2));
  cr_assert(!sl_fault_matches(&f, "windows", 3));
  cr_assert(!sl_fault_matches(&f, NULL, 3));
  cr_assert(!sl_fault_matches(&f, "window", -1));
  f = parse_one("snapshot");
  cr_assert(sl_fault_matches(&f, "anything", 0));
  cr_assert(sl_fault_matches(&f, NULL, -1));
  f = parse_one("snapshot:instance=0");
  cr_assert(sl_fault_matches(&f, "x", 0));
  cr_assert(!sl_fault_matches(&f, "x", 1));
}

#define RACERS 8

/* One of RACERS threads claiming a plan's faults at once.  They wait at a
 * barrier so that they do overlap: started one by one, each could finish
 * before the next began. */
typedef struct racer {
  sl_fault_plan *plan;
  pthread_barrier_t *start;
  int instance;
  uint64_t calls;
  uint64_t hits; /* written by the thread, read after join */
} racer;

/* Run RACERS threads of racer_main over plan, each with its instance
 * number and `calls`; the sum of their hits. */
static uint64_t race(sl_fault_plan *plan, void *(*racer_main)(void *),
                     uint64_t calls) {
  pthread_t threads[RACERS];
  racer args[RACERS];
  pthread_barrier_t start;
  cr_assert_eq(pthread_barrier_init(&start, NULL, RACERS), 0);
  for (int t = 0; t < RACERS; t++) {
    args[t] =
        (racer){.plan = plan, .start = &start, .instance = t, .calls = calls};
    cr_assert_eq(pthread_create(&threads[t], NULL, racer_main, &args[t]), 0);
  }
  uint64_t hits = 0;
  for (int t = 0; t < RACERS; t++) {
    pthread_join(threads[t], NULL);
    hits += args[t].hits;
  }
  pthread_barrier_destroy(&start);
  return hits;
}

/* `calls` store puts; a hit is a put the plan fires on. */
static void *occur_thread(void *arg) {
  racer *a = arg;
  pthread_barrier_wait(a->start);
  for (uint64_t i = 0; i < a->calls; i++)
    a->hits += sl_fault_occur(a->plan, SL_FAULT_STORE, SL_FAULT_CALL_PUT, NULL,
                              -1) != NULL;
  return NULL;
}

/* Run RACERS threads of `calls` store puts each; total fired. */
static uint64_t occur_in_threads(sl_fault_plan *plan, uint64_t calls) {
  return race(plan, occur_thread, calls);
}

Test(occur, threads_fire_exactly_times) {
  const uint64_t calls = 50000;
  sl_fault_plan *plan = parse_ok("store:call=put,nth=1000,times=12345", 1);
  cr_assert_eq(occur_in_threads(plan, calls), 12345);
  cr_assert_eq(loaded(&plan->faults[0].fired), 12345);
  cr_assert_eq(loaded(&plan->faults[0].occurrences), RACERS * calls);
  sl_fault_plan_free(plan);
  /* persistent: every occurrence from nth on */
  plan = parse_ok("store:call=put,nth=7,persistent", 1);
  cr_assert_eq(occur_in_threads(plan, calls), RACERS * calls - 6);
  sl_fault_plan_free(plan);
  /* more times than occurrences: all of them from nth on */
  plan = parse_ok("store:call=put,nth=3,times=1000000000", 1);
  cr_assert_eq(occur_in_threads(plan, calls), RACERS * calls - 2);
  sl_fault_plan_free(plan);
}

/* ------------------------------------------------------------ cursors */

TestSuite(cursor, .timeout = 60);

Test(cursor, inactive_without_matching_faults) {
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, NULL, "count", 0, 0);
  cr_assert(!sl_fault_cursor_active(&c));
  sl_fault_plan *plan =
      parse_ok("fail:op=count,instance=1,record=5; slow:op=sink,delay_us=3;"
               "snapshot:op=count; write",
               4);
  sl_fault_cursor_init(&c, plan, "count", 0, 0);
  cr_assert(!sl_fault_cursor_active(&c), "wrong instance");
  sl_fault_cursor_init(&c, plan, "map", 1, 0);
  cr_assert(!sl_fault_cursor_active(&c), "wrong operator");
  sl_fault_cursor_init(&c, plan, "count", 1, 0);
  cr_assert(sl_fault_cursor_active(&c));
  cr_assert_eq(c.count, 1, "snapshot faults are not per record");
  sl_fault_cursor_init(&c, plan, "sink", 4, 0);
  cr_assert_eq(c.count, 1);
  cr_assert_eq(c.faults[0], &plan->faults[1]);
  sl_fault_plan_free(plan);
}

/* Step n records; return the record numbers (since the last restart) at
 * which a fail fired, at most cap of them, and the count in *fails. */
static int step_records(sl_fault_cursor *c, uint64_t n, uint64_t *at, int cap) {
  int fails = 0;
  for (uint64_t i = 0; i < n; i++) {
    sl_fault_step s = sl_fault_cursor_next(c);
    if (s.fail) {
      if (fails < cap)
        at[fails] = c->record;
      fails++;
    }
  }
  return fails;
}

Test(cursor, record_fires_exactly_at_n) {
  sl_fault_plan *plan = parse_ok("fail:op=count,record=5000", 1);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "count", 0, 0);
  for (uint64_t r = 1; r <= 10000; r++) {
    sl_fault_step s = sl_fault_cursor_next(&c);
    cr_assert_eq(s.fail != NULL, r == 5000, "record %llu",
                 (unsigned long long)r);
    cr_assert_eq(s.delay_us, 0);
    if (s.fail)
      cr_assert_eq(s.fail, &plan->faults[0]);
  }
  cr_assert_eq(loaded(&plan->faults[0].fired), 1);
  sl_fault_plan_free(plan);
}

Test(cursor, record_fires_at_n_of_each_restart_up_to_times) {
  sl_fault_plan *plan = parse_ok("fail:record=10,times=2", 1);
  sl_fault *f = &plan->faults[0];
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "any", 0, 0);
  uint64_t at[4];
  cr_assert_eq(step_records(&c, 15, at, 4), 1);
  cr_assert_eq(at[0], 10);
  sl_fault_cursor_restart(&c);
  cr_assert_eq(c.record, 0);
  cr_assert_eq(step_records(&c, 15, at, 4), 1);
  cr_assert_eq(at[0], 10, "counted from the restart");
  sl_fault_cursor_restart(&c);
  cr_assert_eq(step_records(&c, 100, at, 4), 0, "times=2 used up");
  cr_assert_eq(loaded(&f->fired), 2);
  cr_assert_eq(loaded(&f->occurrences), 3, "due three times, fired twice");
  sl_fault_plan_free(plan);
}

Test(cursor, times_is_shared_by_instances) {
  sl_fault_plan *plan = parse_ok("fail:op=count,record=3,times=3", 1);
  sl_fault_cursor c[5];
  for (int i = 0; i < 5; i++)
    sl_fault_cursor_init(&c[i], plan, "count", i, (uint32_t)i);
  uint64_t at[2];
  int total = 0;
  for (int i = 0; i < 5; i++)
    total += step_records(&c[i], 10, at, 2);
  cr_assert_eq(total, 3);
  cr_assert_eq(loaded(&plan->faults[0].fired), 3);
  sl_fault_plan_free(plan);
}

/* Indices (1-based, over all records stepped) at which c fails among the
 * first n records; returns how many. */
static int fail_indices(sl_fault_cursor *c, int n, int *at, int cap) {
  int fails = 0;
  for (int i = 1; i <= n; i++)
    if (sl_fault_cursor_next(c).fail) {
      if (fails < cap)
        at[fails] = i;
      fails++;
    }
  return fails;
}

#define PROB_CAP 4096

/* Fail indices of prob faults with this seed on this stable instance. */
static int prob_run(const char *spec, uint32_t stable, int n, int *at) {
  sl_fault_plan *plan = parse_ok(spec, 1);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "op", 0, stable);
  int fails = fail_indices(&c, n, at, PROB_CAP);
  sl_fault_plan_free(plan);
  return fails;
}

Test(cursor, prob_is_deterministic_for_a_seed) {
  static int a[PROB_CAP], b[PROB_CAP];
  int na = prob_run("fail:prob=0.01,seed=7,times=inf", 3, 100000, a);
  int nb = prob_run("fail:prob=0.01,seed=7,times=inf", 3, 100000, b);
  cr_assert_gt(na, 0);
  cr_assert_eq(na, nb);
  cr_assert_leq(na, PROB_CAP);
  cr_assert_arr_eq(a, b, (size_t)na * sizeof a[0], "same seed, same fails");
  /* another seed, or another instance: another sequence */
  nb = prob_run("fail:prob=0.01,seed=8,times=inf", 3, 100000, b);
  cr_assert(na != nb || memcmp(a, b, (size_t)na * sizeof a[0]) != 0);
  nb = prob_run("fail:prob=0.01,seed=7,times=inf", 4, 100000, b);
  cr_assert(na != nb || memcmp(a, b, (size_t)na * sizeof a[0]) != 0);
}

Test(cursor, prob_rate_over_a_million_records) {
  /* Binomial(1e6, p): the bounds are more than 5 standard deviations out,
   * so a correct generator does not fail them; a biased one does. */
  static const struct {
    const char *spec;
    int low, high;
  } cases[] = {
      {"fail:prob=0.01,times=inf", 9500, 10500},    /* sd 99.5 */
      {"fail:prob=0.001,seed=3,times=inf", 840, 1160}, /* sd 31.6 */
      {"fail:prob=0.5,seed=99,times=inf", 497500, 502500}, /* sd 500 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    static int at[PROB_CAP];
    int fails = prob_run(cases[i].spec, (uint32_t)i, 1000000, at);
    cr_assert(fails >= cases[i].low && fails <= cases[i].high,
              "%s: %d fails in 1e6 records", cases[i].spec, fails);
  }
}

Test(cursor, prob_one_fires_every_record_and_times_caps_it) {
  sl_fault_plan *plan = parse_ok("fail:prob=1,times=inf", 1);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "op", 0, 0);
  int at[8];
  cr_assert_eq(fail_indices(&c, 1000, at, 8), 1000);
  sl_fault_plan_free(plan);
  plan = parse_ok("fail:prob=1,times=5", 1);
  sl_fault_cursor_init(&c, plan, "op", 0, 0);
  cr_assert_eq(fail_indices(&c, 1000, at, 8), 5);
  cr_assert_eq(at[4], 5);
  cr_assert_eq(loaded(&plan->faults[0].occurrences), 1000);
  cr_assert_eq(loaded(&plan->faults[0].fired), 5);
  sl_fault_plan_free(plan);
}

Test(cursor, restart_keeps_the_generator_going) {
  /* Two runs of the same fault on the same instance: one straight through,
   * one restarted every 1000 records.  Restarts must not rewind the
   * draws, so both fail at the same overall record indices. */
  sl_fault_plan *plan_a = parse_ok("fail:prob=0.02,seed=5,times=inf", 1);
  sl_fault_plan *plan_b = parse_ok("fail:prob=0.02,seed=5,times=inf", 1);
  sl_fault_cursor a, b;
  sl_fault_cursor_init(&a, plan_a, "op", 1, 11);
  sl_fault_cursor_init(&b, plan_b, "op", 1, 11);
  int fails = 0;
  for (int i = 1; i <= 10000; i++) {
    if (i % 1000 == 1 && i > 1) {
      sl_fault_cursor_restart(&b);
      cr_assert_eq(b.record, 0);
    }
    bool fa = sl_fault_cursor_next(&a).fail != NULL;
    bool fb = sl_fault_cursor_next(&b).fail != NULL;
    cr_assert_eq(fa, fb, "record %d", i);
    cr_assert_eq(b.record, (uint64_t)((i - 1) % 1000 + 1));
    fails += fa;
  }
  cr_assert_gt(fails, 100, "0.02 of 10000 records is about 200");
  sl_fault_plan_free(plan_a);
  sl_fault_plan_free(plan_b);
}

/* `calls` records of instance `instance` of op "op"; a hit is a record
 * the plan fails. */
static void *cursor_thread(void *arg) {
  racer *a = arg;
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, a->plan, "op", a->instance, (uint32_t)a->instance);
  pthread_barrier_wait(a->start);
  for (uint64_t i = 0; i < a->calls; i++)
    a->hits += sl_fault_cursor_next(&c).fail != NULL;
  return NULL;
}

Test(cursor, threads_share_times_exactly) {
  /* prob=1: every record of every thread competes for the 100000 times
   * (of 400000 records), so claims do collide */
  sl_fault_plan *plan = parse_ok("fail:op=op,prob=1,times=100000", 1);
  uint64_t fails = race(plan, cursor_thread, 50000);
  cr_assert_eq(fails, 100000);
  cr_assert_eq(loaded(&plan->faults[0].fired), 100000);
  sl_fault_plan_free(plan);
}

Test(cursor, slow_delays_the_right_records) {
  sl_fault_plan *plan = parse_ok("slow:op=sink,delay_us=500,from=3,records=2", 1);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "sink", 0, 0);
  for (int run = 0; run < 2; run++) {
    for (uint64_t r = 1; r <= 10; r++) {
      sl_fault_step s = sl_fault_cursor_next(&c);
      cr_assert_null(s.fail);
      cr_assert_eq(s.delay_us, r == 3 || r == 4 ? 500u : 0u, "run %d record %d",
                   run, (int)r);
      cr_assert_eq(s.slow_begins, r == 3 ? &plan->faults[0] : NULL);
    }
    sl_fault_cursor_restart(&c); /* the range counts from each restart */
  }
  cr_assert_eq(loaded(&plan->faults[0].fired), 4, "delayed records");
  sl_fault_plan_free(plan);
}

Test(cursor, slow_defaults_delay_every_record) {
  sl_fault_plan *plan = parse_ok("slow:delay_us=7", 1);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "any", 9, 0);
  for (int r = 1; r <= 1000; r++) {
    sl_fault_step s = sl_fault_cursor_next(&c);
    cr_assert_eq(s.delay_us, 7);
    cr_assert_eq(s.slow_begins != NULL, r == 1);
  }
  sl_fault_plan_free(plan);
}

Test(cursor, slow_and_fail_together) {
  sl_fault_plan *plan =
      parse_ok("slow:delay_us=100,from=2; slow:delay_us=20,from=3,records=1;"
               "fail:record=3; fail:record=3",
               4);
  sl_fault_cursor c;
  sl_fault_cursor_init(&c, plan, "op", 0, 0);
  cr_assert_eq(c.count, 4);
  sl_fault_step s = sl_fault_cursor_next(&c);
  cr_assert_eq(s.delay_us, 0);
  s = sl_fault_cursor_next(&c);
  cr_assert_eq(s.delay_us, 100);
  cr_assert_eq(s.slow_begins, &plan->faults[0]);
  s = sl_fault_cursor_next(&c);
  cr_assert_eq(s.delay_us, 120, "delays add up");
  cr_assert_eq(s.slow_begins, &plan->faults[1]);
  cr_assert_eq(s.fail, &plan->faults[2], "the first fail fault wins");
  cr_assert_eq(loaded(&plan->faults[3].fired), 0, "and the other keeps its time");
  cr_assert_eq(loaded(&plan->faults[3].occurrences), 1);
  s = sl_fault_cursor_next(&c);
  cr_assert_eq(s.delay_us, 100);
  cr_assert_null(s.fail);
  sl_fault_plan_free(plan);
}

/* ------------------------------------------------------------ text */

TestSuite(text, .timeout = 30);

Test(text, describe) {
  sl_fault_plan *plan = parse_ok(" fail:op=count,record=5000 ", 1);
  char buf[128];
  int n = sl_fault_describe(&plan->faults[0], buf, sizeof buf);
  cr_assert_str_eq(buf, "injected fault 'fail:op=count,record=5000'");
  cr_assert_eq(n, (int)strlen(buf));
  char small[10];
  n = sl_fault_describe(&plan->faults[0], small, sizeof small);
  cr_assert_str_eq(small, "injected ");
  cr_assert_eq(n, (int)strlen(buf), "the length it needed, like snprintf");
  sl_fault_plan_free(plan);
}

Test(text, names) {
  cr_assert_str_eq(sl_fault_kind_name(SL_FAULT_RESTORE), "restore");
  cr_assert_str_eq(sl_fault_kind_name(SL_FAULT_CRASH), "crash");
  cr_assert_str_eq(sl_fault_call_name(SL_FAULT_CALL_COMMIT), "commit");
  cr_assert_str_eq(sl_fault_point_name(SL_CRASH_SINK_COMMIT), "sink-commit");
  cr_assert_str_eq(sl_fault_error_name(MDB_MAP_FULL), "MAP_FULL");
  cr_assert_str_eq(sl_fault_error_name(ENOSPC), "ENOSPC");
  cr_assert_str_eq(sl_fault_error_name(EBADF), "?");
}

/* What the log lines on the redirected stderr say, each without its
 * "TIME LEVEL [THREAD] " prefix (engine/log.h), which is checked. */
static char *logged_messages(void) {
  fflush(stderr);
  FILE *f = cr_get_redirected_stderr();
  cr_assert(f);
  static char text[8192];
  size_t used = 0;
  char line[4096];
  while (fgets(line, sizeof line, f)) { /* bounded by what was written */
    cr_assert_eq(line[23], 'Z', "no time in '%s'", line);
    cr_assert_eq(strncmp(line + 24, " INFO  [", 8), 0, "'%s'", line);
    const char *message = strstr(line, "] ");
    cr_assert(message);
    size_t n = strlen(message + 2);
    cr_assert(used + n < sizeof text);
    memcpy(text + used, message + 2, n + 1);
    used += n;
  }
  return text;
}

Test(text, log_line, .init = cr_redirect_stderr) {
  sl_log_set_handler(sl_log_stderr, NULL); /* silent unless asked */
  sl_log_set_level(SL_LOG_INFO);
  sl_fault_plan *plan = parse_ok("fail:op=count,record=5000; write", 2);
  sl_fault_log(&plan->faults[0], "operator '%s' instance %d, record %d",
               "count", 2, 5000);
  sl_fault_log(&plan->faults[1], NULL);
  cr_assert_str_eq(
      logged_messages(),
      "sluice: injecting fault 'fail:op=count,record=5000' (operator 'count' "
      "instance 2, record 5000)\n"
      "sluice: injecting fault 'write'\n");
  sl_fault_plan_free(plan);
}

Test(text, long_log_line_is_cut, .init = cr_redirect_stderr) {
  sl_log_set_handler(sl_log_stderr, NULL); /* silent unless asked */
  sl_log_set_level(SL_LOG_INFO);
  sl_fault_plan *plan = parse_ok("write", 1);
  char detail[1000];
  memset(detail, 'd', sizeof detail - 1);
  detail[sizeof detail - 1] = 0;
  sl_fault_log(&plan->faults[0], "%s", detail);
  char expected[600];
  int n = snprintf(expected, sizeof expected,
                   "sluice: injecting fault 'write' (");
  memset(expected + n, 'd', (size_t)(509 - n));
  strcpy(expected + 509, ")\n");
  cr_assert_str_eq(logged_messages(), expected);
  sl_fault_plan_free(plan);
}

Test(text, crash_check_kills_at_nth) {
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t child = fork();
  cr_assert_neq(child, -1);
  if (child == 0) {
    /* the child never calls Criterion: it reports through the pipe and
     * how it ends */
    close(fds[0]);
    if (!freopen("/dev/null", "w", stderr))
      _exit(4);
    sl_fault_plan *plan = NULL;
    if (sl_fault_plan_parse("crash:point=after-commit,nth=2", &plan, NULL, 0))
      _exit(5);
    sl_fault_crash_check(plan, SL_CRASH_MID_WRITE);     /* another point */
    sl_fault_crash_check(plan, SL_CRASH_AFTER_COMMIT);  /* occurrence 1 */
    sl_fault_crash_check(NULL, SL_CRASH_AFTER_COMMIT);  /* no plan */
    if (write(fds[1], "1", 1) != 1)
      _exit(6);
    sl_fault_crash_check(plan, SL_CRASH_AFTER_COMMIT);  /* occurrence 2 */
    _exit(3);
  }
  close(fds[1]);
  char byte = 0;
  cr_assert_eq(read(fds[0], &byte, 1), 1, "the child died too early");
  close(fds[0]);
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFSIGNALED(status), "child exited with %d instead of dying",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  cr_assert_eq(WTERMSIG(status), SIGKILL);
}
