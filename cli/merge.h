/* merge.h — the committed rows of a file sink's directory, sorted into one
 * CSV file in bounded memory (cli/merge.c; `sluice nexmark run --output`).
 *
 * NOTES ON THE DESIGN OF THE MERGE
 *
 * 1. Rows are split the RFC 4180 way: a newline ends a row unless it is
 *    inside a quoted field (an odd number of '"' so far in the row; a
 *    doubled quote counts twice, so escapes keep the parity).  The newline
 *    that ends a row is not part of it.  A file that ends inside a quoted
 *    field is refused, naming it.  The first row of each part is skipped
 *    when it equals the header.
 * 2. Rows are ordered by their bytes: memcmp over the shorter length, then
 *    the shorter first.  For rows without NUL bytes this is strcmp's
 *    order, so ordinary output is byte for byte what it always was.
 * 3. External merge sort.  Rows are read into a run buffer of run_bytes
 *    (row bytes plus a 16-byte index entry each); a full buffer is sorted
 *    and spilled to a temporary file beside the output (created and
 *    unlinked at once, so a killed merge leaves nothing), as length-framed
 *    rows.  MERGE_FAN_IN runs of one level are merged into one run of the
 *    next level as soon as they exist, so at most MERGE_FAN_IN - 1 runs
 *    wait per level; at the end every run left (and the buffer) is merged
 *    into the output with a k-way heap.  A merge that never filled the
 *    buffer sorts in memory and writes the output directly.
 * 4. Memory bound: run_bytes (or the longest row, if longer) for the
 *    buffer, plus, while merging, per open run one read buffer
 *    (MERGE_READ_BUFFER_BYTES) and its current row.  Open runs: at most
 *    (MERGE_FAN_IN - 1) x MERGE_MAX_LEVELS + 1; with 64 MiB runs, 16
 *    levels cover far more than a disk holds.
 * 5. The output goes to PATH.tmp, is fsynced and renamed to PATH: PATH is
 *    the old file or the whole new one, never a part.
 */
#ifndef SL_CLI_MERGE_H
#define SL_CLI_MERGE_H

#include <stddef.h>
#include <stdint.h>

/* Default run buffer, and the environment variable that overrides it (a
 * byte count; tests set a tiny one to force many runs). */
#define MERGE_DEFAULT_RUN_BYTES ((size_t)64 << 20)
#define MERGE_RUN_BYTES_ENV "SLUICE_MERGE_RUN_BYTES"

/** The run buffer size: MERGE_RUN_BYTES_ENV if set to a whole number of
 * at least 1, else MERGE_DEFAULT_RUN_BYTES. */
size_t merge_run_bytes(void);

/** Sort every row of the committed parts of dir (files named part-*, in
 * name order) into path, with header as its first line (note 5).  *rows:
 * the rows written.  Returns 0, or an errno value with err saying what
 * failed and naming the file (EINVAL: a part ends inside a quoted field).
 * On error path is unchanged and nothing is left behind but path.tmp. */
int merge_parts(const char *dir, const char *path, const char *header,
                size_t run_bytes, uint64_t *rows, char *err,
                size_t err_bytes);

#endif /* SL_CLI_MERGE_H */
