/* options.c — `sluice run JOB`'s options: the usage text, parsing them
 * into an options struct (run.h), and the checks between them before a
 * job is made.  Every mistake is a usage error (exit status 2). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "run.h"

void run_usage(FILE *out) {
  fprintf(out,
          "usage: sluice run JOB [options]\n"
          "       sluice nexmark gen|run [options]   (sluice nexmark --help)\n"
          "       sluice checkpoints DIR [options]   (sluice checkpoints --help)\n"
          "       sluice kafka mock|dump [options]   (sluice kafka --help)\n"
          "       sluice jobs\n"
          "       sluice --help | --version\n"
          "\n"
          "Jobs:\n"
          "  pipeline   source -> map (v*3+1) -> filter (v%%4 != 0) -> sink; the\n"
          "             sink's count and sum are checked against the closed form\n"
          "  keyed      source -> key_by(key) -> running count per key -> sink;\n"
          "             checks that every key was counted at one instance\n"
          "  count      the keyed job with the counts in checkpointed keyed state and\n"
          "             an exactly-once file sink (--output); checks the committed\n"
          "             files, also after a stop or kill and --resume\n"
          "  window     keyed source (each key's records in order) -> key_by -> a\n"
          "             count window of --window records per key (sum of values) ->\n"
          "             exactly-once file sink (--output), plus a verifying sink on\n"
          "             the source; prints a verdict on the committed output, the\n"
          "             restarts and recovery times\n"
          "\n"
          "Options:\n"
          "  --records N          records the source emits (default 50000000)\n"
          "  --keys K             distinct keys, key = i %% K (default 10000)\n"
          "  --parallelism P      instances of each operator (default 1)\n"
          "  --ring-bytes B       bytes per ring, power of two (default: automatic,\n"
          "                       4 MiB while all rings fit in 256 MiB)\n"
          "  --batch N            records per output batch (default 1024)\n"
          "  --buffer-timeout-us U  publish partial batches after U us (default 1000)\n"
          "  --spin N             spin iterations before parking (default: 20 when\n"
          "                       threads outnumber CPUs, else 2000)\n"
          "  --cpus LIST          CPUs to pin to, e.g. 0,1 (default: all allowed)\n"
          "  --pin-round-robin    pin instances round-robin in creation order\n"
          "  --no-pin             do not pin threads\n"
          "  --chaining MODE      auto (default: when instances outnumber CPUs),\n"
          "                       always or never: run an instance whose only\n"
          "                       input is one upstream instance in its thread\n"
          "  --state-dir DIR      take checkpoints into the LMDB store in DIR\n"
          "  --resume             resume from DIR's newest checkpoint (or refuse)\n"
          "  --fresh              delete DIR's checkpoints (and --output's parts)\n"
          "  --from-savepoint SP  start from savepoint SP (copied into --state-dir,\n"
          "                       which must hold no checkpoints, or --fresh)\n"
          "  --savepoint-dir DIR  SIGUSR1 writes a savepoint to DIR/savepoint-<id>;\n"
          "                       the only place POST /savepoints may write\n"
          "  --stop-savepoint DIR the first SIGTERM or SIGINT stops the job with a\n"
          "                       savepoint into DIR (Flink's stop: no end of input,\n"
          "                       windows stay open; resume with --from-savepoint\n"
          "                       DIR), prints `stopped with savepoint DIR\n"
          "                       (checkpoint N)` and exits 0; a second one stops\n"
          "                       at once\n"
          "  --drain              with --stop-savepoint: end the input first (final\n"
          "                       watermark, windows fire), as Flink's stop --drain\n");
  fprintf(out,
          "  --checkpoint-interval-ms N  between checkpoints (default 1000)\n"
          "  --checkpoint-timeout-ms N   abort a checkpoint after N ms (default 60000)\n"
          "  --min-pause-ms N     least pause between checkpoints (default 0)\n"
          "  --max-concurrent N   checkpoints in flight (default: 1 at intervals of\n"
          "                       100 ms or more or with --min-pause-ms, else up to 4)\n"
          "  --tolerable-failures N  consecutive failed checkpoints tolerated (0)\n"
          "  --at-least-once      barriers not aligned: every input is read until the\n"
          "                       last barrier arrives, so records after a barrier may\n"
          "                       be in the snapshot and are replayed after a failure\n"
          "                       (duplicates, never loss)\n"
          "  --unaligned          unaligned checkpoints: barriers overtake the\n"
          "                       records in flight, which are saved with the\n"
          "                       checkpoint and replayed on restore (exactly-once;\n"
          "                       stop savepoints stay aligned)\n"
          "  --aligned-timeout-ms MS  with --unaligned: start each checkpoint\n"
          "                       aligned, switch an instance to unaligned once\n"
          "                       its alignment lasted MS ms (default 0: unaligned\n"
          "                       from the start)\n"
          "  --copy-pass-mib N|off  after a barrier a keyed instance copies up to\n"
          "                       N MiB of changed state, so that later writes go\n"
          "                       in place (default 256); off: copy on write only,\n"
          "                       which can save memory and costs throughput\n"
          "                       (docs/checkpoints.md)\n"
          "  --no-sync            commit checkpoints without fsync (benchmarks)\n"
          "  --output DIR         count: key,count lines; window: key,window,sum\n"
          "                       lines; part files in DIR\n"
          "  --window N           window: records per count window (default 100)\n"
          "  --fault SPEC         inject faults (repeatable; grammar in docs/failover-\n"
          "                       and-faults.md); SLUICE_FAULTS adds more\n"
          "  --restart STRATEGY   after a failure: none (default),\n"
          "                       fixed-delay[:ATTEMPTS[:DELAY_MS]],\n"
          "                       exponential-delay[:INITIAL_MS[:MAX_MS[:MULT[:JITTER]]]],\n"
          "                       failure-rate[:MAX[:INTERVAL_MS[:DELAY_MS]]]\n"
          "                       (omitted fields: Flink's defaults)\n");
  /* Two calls: C11 promises string literals of 4095 bytes only. */
  fprintf(out,
          "  --http [ADDR:]PORT   serve /metrics, /jobs, /checkpoints, POST\n"
          "                       /savepoints and POST /stop on ADDR (default\n"
          "                       127.0.0.1); port 0 picks a free one (printed);\n"
          "                       both POSTs write below --savepoint-dir only\n"
          "  --http-token-file FILE  requests need Authorization: Bearer TOKEN,\n"
          "                       TOKEN the file's first line (else the\n"
          "                       SLUICE_HTTP_TOKEN variable); needed for an\n"
          "                       ADDR other than loopback\n"
          "  --quiet              no live status line\n"
          "  --status-interval-ms N  status every N ms (default: 500 in place on\n"
          "                       a terminal, else a line every 5000)\n"
          "  --log-level LEVEL    error, warn, info (default) or debug; the\n"
          "                       default comes from SLUICE_LOG_LEVEL if set\n"
          "  --json               print the summary as one JSON object\n"
          "  -h, --help           this text\n"
          "\n"
          "Exit status: 0 success, 1 the job failed or did not verify, 2 a usage\n"
          "error, 130 stopped by SIGINT, 143 stopped by SIGTERM.\n");
}

void run_parse_options(int argc, char **argv, int first, options *o) {
  for (int i = first; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : 0;
    if (strcmp(a, "--records") == 0)
      o->records = parse_u64(a, v, 1, UINT64_MAX / 4), i++;
    else if (strcmp(a, "--keys") == 0)
      o->keys = parse_u64(a, v, 1, UINT32_MAX), i++;
    else if (strcmp(a, "--parallelism") == 0)
      o->parallelism = (int)parse_u64(a, v, 1, SL_MAX_PARALLELISM), i++;
    else if (strcmp(a, "--ring-bytes") == 0)
      o->config.ring_bytes = parse_u64(a, v, 4096, 1ull << 30), i++;
    else if (strcmp(a, "--batch") == 0)
      o->config.output_batch_records = (uint32_t)parse_u64(a, v, 1, 65535), i++;
    else if (strcmp(a, "--buffer-timeout-us") == 0)
      o->config.buffer_timeout_us = (uint32_t)parse_u64(a, v, 1, 60000000), i++;
    else if (strcmp(a, "--spin") == 0)
      o->config.spin_iterations = (uint32_t)parse_u64(a, v, 1, 100000000), i++;
    else if (strcmp(a, "--cpus") == 0)
      o->config.cpu_count = parse_cpus(v, o->cpus), o->config.cpus = o->cpus, i++;
    else if (strcmp(a, "--pin-round-robin") == 0)
      o->config.pin_policy = SL_PIN_ROUND_ROBIN;
    else if (strcmp(a, "--no-pin") == 0)
      o->config.no_pinning = 1;
    else if (strcmp(a, "--chaining") == 0)
      o->config.chaining = parse_chaining(a, v), i++;
    else if (strcmp(a, "--copy-pass-mib") == 0)
      o->config.checkpoint_copy_pass_bytes = parse_copy_pass(a, v), i++;
    else if (strcmp(a, "--state-dir") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->config.checkpoint.state_dir = v, i++;
    } else if (strcmp(a, "--resume") == 0)
      o->config.checkpoint.store_policy = SL_STORE_RESUME;
    else if (strcmp(a, "--fresh") == 0)
      o->config.checkpoint.store_policy = SL_STORE_FRESH;
    else if (strcmp(a, "--from-savepoint") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->config.checkpoint.from_savepoint = v, i++;
    } else if (strcmp(a, "--savepoint-dir") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->savepoint_dir = v, i++;
    } else if (strcmp(a, "--stop-savepoint") == 0) {
      if (!v || !*v)
        die_usage("%s needs a directory", a);
      o->stop_savepoint = v, i++;
    } else if (strcmp(a, "--drain") == 0)
      o->drain = true;
    else if (strcmp(a, "--checkpoint-interval-ms") == 0)
      o->config.checkpoint.interval_ms = (uint32_t)parse_u64(a, v, 1, 86400000), i++;
    else if (strcmp(a, "--checkpoint-timeout-ms") == 0)
      o->config.checkpoint.timeout_ms = (uint32_t)parse_u64(a, v, 1, 86400000), i++;
    else if (strcmp(a, "--min-pause-ms") == 0)
      o->config.checkpoint.min_pause_ms = (uint32_t)parse_u64(a, v, 0, 86400000), i++;
    else if (strcmp(a, "--max-concurrent") == 0)
      o->config.checkpoint.max_concurrent = (uint32_t)parse_u64(a, v, 1, 16), i++;
    else if (strcmp(a, "--tolerable-failures") == 0)
      o->config.checkpoint.tolerable_failures = (uint32_t)parse_u64(a, v, 0, 1000000), i++;
    else if (strcmp(a, "--at-least-once") == 0)
      o->config.checkpoint.mode = SL_AT_LEAST_ONCE;
    else if (strcmp(a, "--unaligned") == 0)
      o->config.checkpoint_unaligned = 1;
    else if (strcmp(a, "--aligned-timeout-ms") == 0)
      o->config.checkpoint_aligned_timeout_ms =
          (uint32_t)parse_u64(a, v, 1, 86400000), i++;
    else if (strcmp(a, "--no-sync") == 0)
      o->config.checkpoint.no_sync = 1;
    else if (strcmp(a, "--output") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->output_dir = v, i++;
    } else if (strcmp(a, "--window") == 0)
      o->window = parse_u64(a, v, 1, UINT32_MAX), i++;
    else if (strcmp(a, "--fault") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      size_t used = strlen(o->faults);
      if (used + strlen(v) + 2 > sizeof o->faults)
        die_usage("--fault: the specs are longer than %zu bytes in all",
                  sizeof o->faults - 1);
      snprintf(o->faults + used, sizeof o->faults - used, "%s%s",
               used ? ";" : "", v);
      o->config.faults = o->faults, i++;
    } else if (strcmp(a, "--restart") == 0)
      parse_restart(v, &o->config.restart), i++;
    else if (strcmp(a, "--http") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->http = v, i++;
    } else if (strcmp(a, "--http-token-file") == 0) {
      if (!v)
        die_usage("%s needs a value", a);
      o->http_token_file = v, i++;
    } else if (strcmp(a, "--quiet") == 0)
      o->quiet = true;
    else if (strcmp(a, "--status-interval-ms") == 0)
      o->status_interval_ms = (uint32_t)parse_u64(a, v, 10, 3600000), i++;
    else if (strcmp(a, "--log-level") == 0)
      parse_log_level(a, v), i++;
    else if (strcmp(a, "--json") == 0)
      o->json = true;
    else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
      run_usage(stdout), exit(0);
    else
      die_usage("unknown option '%s'", a);
  }
}

void run_check_options(options *o) {
  bool window = strcmp(o->job_name, "window") == 0;
  bool count = strcmp(o->job_name, "count") == 0;
  if (strcmp(o->job_name, "pipeline") != 0 && strcmp(o->job_name, "keyed") != 0 &&
      !count && !window)
    die_usage("unknown job '%s' (sluice jobs lists them)", o->job_name);
  if (o->output_dir && !count && !window)
    die_usage("--output is for the count and window jobs");
  if (window && !o->output_dir)
    die_usage("the window job needs --output: its committed files are what "
              "the verdict is about");
  if (window && !o->config.checkpoint.state_dir)
    die_usage("the window job needs --state-dir: it is the checkpointed job");
  if (o->window && !window)
    die_usage("--window is for the window job");
  if (!o->window)
    o->window = 100;
  if (o->config.checkpoint.store_policy && !o->config.checkpoint.state_dir)
    die_usage("--resume and --fresh need --state-dir");
  if ((o->config.checkpoint.from_savepoint || o->savepoint_dir) &&
      !o->config.checkpoint.state_dir)
    die_usage("--from-savepoint and --savepoint-dir need --state-dir");
  if (o->stop_savepoint && !o->config.checkpoint.state_dir)
    die_usage("--stop-savepoint needs --state-dir (the savepoint is a "
              "checkpoint's copy)");
  if (o->drain && !o->stop_savepoint)
    die_usage("--drain is for --stop-savepoint");
  check_unaligned_options(&o->config);
  if (o->config.checkpoint.from_savepoint && !o->output_dir)
    die_usage("--from-savepoint is for the count and window jobs with "
              "--output: the committed files are what the run is checked by");
  /* pipeline and keyed keep their results outside checkpointed state (a
   * checksum, a plain counter array): they may take checkpoints, for
   * measurements, but a resumed run could not verify. */
  if (o->config.checkpoint.store_policy == SL_STORE_RESUME && !count &&
      !window)
    die_usage("--resume is for the count and window jobs (pipeline and keyed "
              "keep their results outside checkpointed state)");
  if (o->config.restart.strategy != SL_RESTART_NONE &&
      !(window || (count && o->output_dir)))
    die_usage("--restart is for the window job and the count job with "
              "--output (elsewhere the results are not checkpointed, so a "
              "restarted run could not verify)");
  if (o->config.checkpoint.store_policy == SL_STORE_RESUME && !o->output_dir)
    die_usage("--resume needs --output: the committed files are what a "
              "resumed run is checked by");
  if (o->parallelism > 128)
    o->config.max_parallelism = (uint32_t)o->parallelism; /* key groups */
}
