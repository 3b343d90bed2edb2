/* config_abi.h — reading a public config struct by the size its caller was
 * built with (config_abi.c; sluice.h, ABI).  Private to the library.
 */
#ifndef SLUICE_CONFIG_ABI_H
#define SLUICE_CONFIG_ABI_H

#include <stddef.h>

#include "sluice.h"
#include "sluice_embed.h"
#include "sluice_io.h"
#include "sluice_table.h"
#include "sluice_window.h"

/* The bytes up to the end of a struct's last field. */
#define SL_END_OF(type, field)                                                 \
  (offsetof(type, field) + sizeof(((type *)0)->field))

/* The first version of each config struct passed to a builder, frozen: a
 * caller's config_bytes below it is refused, and the old unsized symbols
 * (built against version 1) forward with it.  When a field is added at
 * the end of a struct, its line here stays as it is. */
#define SL_WATERMARK_CONFIG_V1 SL_END_OF(sl_watermark_config, idle_timeout_ms)
#define SL_GENERATOR_CONFIG_V1                                                 \
  SL_END_OF(sl_generator_config, events_per_second)
#define SL_FILE_SINK_CONFIG_V1                                                 \
  SL_END_OF(sl_file_sink_config, clear_other_lineage)
#define SL_FILE_SOURCE_CONFIG_V1                                               \
  SL_END_OF(sl_file_source_config, max_line_bytes)
#define SL_TABLE_SINK_CONFIG_V1 SL_END_OF(sl_table_sink_config, row_user)
#define SL_WINDOW_CONFIG_V1 SL_END_OF(sl_window_config, user)
#define SL_WINDOW_JOIN_CONFIG_V1 SL_END_OF(sl_window_join_config, user)
#define SL_INTERVAL_JOIN_CONFIG_V1 SL_END_OF(sl_interval_join_config, user)

/* Copy the caller's config in (in_bytes, as its header had the struct)
 * into out (out_bytes, this library's struct), zeroed first, so fields the
 * caller does not know read 0 (their defaults).  in NULL: out is zeroed
 * and 0 returned; the builder keeps its own answer to NULL.  EINVAL when
 * in_bytes is below first_bytes, or above out_bytes with a nonzero byte
 * past out_bytes (a field of a newer header that this library would
 * ignore); the message names builder and type and goes to job's error
 * (job may be NULL) and to err (err_bytes; err may be NULL). */
int sl_config_read(sl_job *job, char *err, size_t err_bytes,
                   const char *builder, const char *type, const void *in,
                   size_t in_bytes, void *out, size_t out_bytes,
                   size_t first_bytes);

/* The usual call from a builder: its name and the type spelled once, the
 * library's size from the type, first its SL_*_V1 above; copy points at a
 * local of that type. */
#define SL_CONFIG_READ(job, builder, type, first, in, in_bytes, copy)          \
  sl_config_read((job), NULL, 0, #builder, #type, (in), (in_bytes), (copy),    \
                 sizeof(type), (first))

#endif /* SLUICE_CONFIG_ABI_H */
