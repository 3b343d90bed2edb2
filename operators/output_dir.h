/* output_dir.h — who owns a transactional file sink's output directory
 * (operators/output_dir.c), for operators/file_sink.c.
 *
 * NOTES ON THE DESIGN OF OUTPUT DIRECTORY OWNERSHIP
 *
 * 1. An output directory belongs to one job lineage: a run started with
 *    nothing to restore and every run that resumes from its checkpoints
 *    (--resume, a failover, a savepoint).  The lineage id is a random
 *    nonzero 64-bit number drawn when the sink is built.  It is stored in
 *    DIR/.sluice-lineage (one line, "sluice-lineage 0123456789abcdef") and
 *    in every checkpoint of the sink's state, so a resumed run knows it.
 * 2. A start with nothing to restore claims DIR (sl_output_claim): it is
 *    accepted at once when the marker names its own lineage (an in-process
 *    restart before the first checkpoint completed).  Otherwise committed
 *    parts (part-*) of another lineage, or of none (no marker), refuse the
 *    start with EEXIST naming DIR and a file, unless the caller asked for
 *    a fresh start that clears them.  Without committed parts, or when
 *    clearing, every part file goes (committed and pending .part-*, of any
 *    instance: pending parts are output no checkpoint of this lineage
 *    refers to, e.g. of a process killed before its first checkpoint),
 *    then the marker is written.
 * 3. A restore (sl_output_check_restored) accepts DIR when the marker
 *    names the restored lineage; a missing marker is written (a savepoint
 *    started into a new directory); another lineage's marker refuses the
 *    restore with EEXIST.  State saved before lineages existed has
 *    none: it adopts the marker, or writes the sink's new one.
 * 4. A committed part is never replaced (sl_output_commit): rename with
 *    RENAME_NOREPLACE, or link then unlink where the file system lacks it.
 *    An existing target fails the commit with EEXIST, except the one case
 *    a crash can leave behind, the same file under both names (link done,
 *    unlink not), which a restore finishes.
 * 5. The marker is written through a temporary file and rename, then the
 *    directory is fsynced: a crash leaves the old marker or the new one.
 *    Only a start that found no part file (or cleared them) replaces it.
 */
#ifndef SL_OUTPUT_DIR_H
#define SL_OUTPUT_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SL_OUTPUT_LINEAGE_FILE ".sluice-lineage"

/** A new random nonzero lineage id (getrandom, else time and pid). */
uint64_t sl_output_new_lineage(void);

/** Note 2: claim dir for lineage on a start with nothing to restore.
 * clear: delete another lineage's committed parts instead of refusing.
 * Returns 0, EEXIST (another lineage's committed parts; err says which file
 * and what to do), or an errno value (err names the path). */
int sl_output_claim(const char *dir, uint64_t lineage, bool clear,
                    char *err, size_t err_bytes);

/** Note 3: check dir against the restored lineage (*lineage; 0 for state
 * saved without one, then set to the marker's or to fallback).  Returns
 * 0, EEXIST (another lineage's marker) or an errno value. */
int sl_output_check_restored(const char *dir, uint64_t *lineage,
                             uint64_t fallback, uint64_t checkpoint_id,
                             char *err, size_t err_bytes);

/** Note 4: rename from to to, refusing to replace to.  restoring: the
 * same file under both names (a crash between link and unlink) is
 * finished by removing from.  Returns 0 or an errno value (EEXIST: to
 * exists and is another file). */
int sl_output_commit(const char *from, const char *to, bool restoring);

/** fsync directory dir (its renames and unlinks become durable).  Returns
 * 0 or an errno value. */
int sl_output_sync_dir(const char *dir);

#endif /* SL_OUTPUT_DIR_H */
