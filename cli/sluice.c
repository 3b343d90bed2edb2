/* sluice.c — the command-line tool's main: it reads the command and hands
 * it to the file that does it.
 *
 *   sluice run pipeline [options]   source -> map -> filter -> sink (P1)
 *   sluice run keyed [options]      source -> key_by -> count -> sink
 *   sluice run count [options]      the same with keyed state, checkpoints
 *                                   and an exactly-once file sink
 *   sluice run window [options]     keyed count windows (sums) with
 *                                   checkpoints, faults, failover and a
 *                                   verdict on the committed output
 *   sluice nexmark gen|run [options]  Nexmark (cli/nexmark.c)
 *   sluice checkpoints DIR [options]  inspect a state directory
 *                                   (cli/checkpoints.c)
 *   sluice kafka mock|dump [options]  a mock Kafka cluster, a topic's
 *                                   committed values (cli/kafka.c)
 *   sluice jobs | --help | --version
 *
 * `sluice run JOB` runs a built-in job with a live status line and a
 * verified summary: its options in cli/options.c, the jobs and the run in
 * cli/jobs.c, the verdict on the result in cli/verdict.c.
 *
 * Exit status: 0 success, 1 the job failed or its result did not verify,
 * 2 a usage error, 130 stopped by SIGINT, 143 stopped by SIGTERM.
 */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "kafka.h"
#include "run.h"
#include "sluice.h"

/* jemalloc reads this at start-up: back the heap with transparent huge
 * pages (on this VM, a page fault costs about 10 us, and a 1M-key state is
 * a million small allocations; restoring one runs about 1.5x faster).  The
 * library leaves allocator settings to the program that embeds it; without
 * jemalloc this is an unused variable. */
const char *malloc_conf = "thp:always,metadata_thp:auto";

int main(int argc, char **argv) {
  /* The library writes no log line unless asked (sluice.h, Logging); the
   * CLI shows them on stderr, as it always did. */
  sl_log_set_handler(sl_log_stderr, NULL);
  if (argc < 2) {
    run_usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
    run_usage(stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    /* The library's version, as loaded (sl_version), not the header's. */
    printf("sluice %s\n", sl_version());
    return 0;
  }
  if (strcmp(cmd, "jobs") == 0) {
    printf("pipeline\nkeyed\ncount\nwindow\n");
    return 0;
  }
  if (strcmp(cmd, "nexmark") == 0)
    return nexmark_main(argc - 2, argv + 2);
  if (strcmp(cmd, "checkpoints") == 0)
    return checkpoints_main(argc - 2, argv + 2);
  if (strcmp(cmd, "kafka") == 0)
    return kafka_main(argc - 2, argv + 2);
  if (strcmp(cmd, "run") != 0)
    die_usage("unknown command '%s'", cmd);
  /* `sluice run --help` asks for run's usage, not for a job named
   * "--help": answer it like `sluice --help` (stdout, exit 0). */
  if (argc >= 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
    run_usage(stdout);
    return 0;
  }
  if (argc < 3 || argv[2][0] == '-')
    die_usage("run needs a job name: pipeline, keyed, count or window");
  options o = {.job_name = argv[2], .records = 50000000, .keys = 10000,
               .parallelism = 1};
  run_parse_options(argc, argv, 3, &o);
  return run_job(&o);
}
