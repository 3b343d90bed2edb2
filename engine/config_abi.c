/* config_abi.c — one job: read a caller's config struct by the size the
 * caller's header gave it (sluice.h, ABI), for every builder that takes
 * one by pointer.
 *
 * NOTES
 *
 * 1. The size comes from the caller's compile: each builder's exported
 *    symbol is NAME_sized(..., config_bytes), the size last, and the
 *    header's same-named macro NAME(...) appends sizeof the struct as that
 *    header declares it.  Variadic because a compound literal with two
 *    designators holds a comma the preprocessor would split on; sizeof
 *    the type (not *config) so that NULL still compiles.  Each argument
 *    is passed on once.  The unsized symbols stay exported for programs
 *    linked before, and forward with the version-1 size.  Fields are only
 *    ever added at the end, so the first min(caller, library) bytes mean
 *    the same to both.
 * 2. Older caller (fewer bytes): the fields it lacks stay zero, which every
 *    config struct documents as the default.  Below version 1 is no
 *    layout we ever shipped: refused.
 * 3. Newer caller (more bytes): a field this library does not know is
 *    accepted only while zero (its default), because ignoring a set field
 *    would run the job other than asked.
 * 4. Called once per builder call, never per record.
 */
#include "config_abi.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* The message to both places the caller may read it. */
static int refuse(sl_job *job, char *err, size_t err_bytes, const char *why) {
  if (job)
    sl_job_set_error(job, "%s", why);
  if (err && err_bytes)
    snprintf(err, err_bytes, "%s", why);
  return EINVAL;
}

/* config_abi.h; notes 1-3. */
int sl_config_read(sl_job *job, char *err, size_t err_bytes,
                   const char *builder, const char *type, const void *in,
                   size_t in_bytes, void *out, size_t out_bytes,
                   size_t first_bytes) {
  char why[256];
  memset(out, 0, out_bytes);
  if (!in)
    return 0; /* the builder answers NULL as it always did */
  if (in_bytes < first_bytes) { /* note 2 */
    snprintf(why, sizeof why, "%s: %s is %zu bytes, at least %zu expected "
             "(call %s, whose macro passes the size)", builder, type,
             in_bytes, first_bytes, builder);
    return refuse(job, err, err_bytes, why);
  }
  const unsigned char *bytes = in;
  for (size_t i = out_bytes; i < in_bytes; i++) /* note 3 */
    if (bytes[i]) {
      snprintf(why, sizeof why, "%s: %s is %zu bytes and byte %zu is set, "
               "this library knows %zu bytes (a field of a newer header; "
               "link a newer libsluice or leave the field 0)", builder, type,
               in_bytes, i, out_bytes);
      return refuse(job, err, err_bytes, why);
    }
  memcpy(out, in, in_bytes < out_bytes ? in_bytes : out_bytes);
  return 0;
}
