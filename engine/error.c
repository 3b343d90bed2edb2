/* error.c — sl_strerror: one text for each sluice code, strerror otherwise;
 * and sl_version, the library's own version string. */
#include <lmdb.h>
#include <string.h>

#include "internal.h"

/* meson passes project()'s version (meson.build); a build outside meson
 * must say which version it is. */
#ifndef SL_BUILD_VERSION
#error "SL_BUILD_VERSION is not defined (meson.build passes it)"
#endif

SL_EXPORT const char *sl_version(void) { return SL_BUILD_VERSION; }

SL_EXPORT const char *sl_strerror(int status) {
  switch (status) {
  case SL_SUCCESS:
    return "success";
  case SL_EGRAPH:
    return "SL_EGRAPH: the job graph is invalid";
  case SL_ESTARTED:
    return "SL_ESTARTED: the job has already been started";
  case SL_ECALLBACK:
    return "SL_ECALLBACK: an operator callback failed";
  case SL_ESTOPPED:
    return "SL_ESTOPPED: the job was stopped";
  case SL_ETOOBIG:
    return "SL_ETOOBIG: record larger than max_record_bytes";
  case SL_EUSAGE:
    return "SL_EUSAGE: call not allowed here";
  case SL_ENOTSTARTED:
    return "SL_ENOTSTARTED: the job has not been started";
  case SL_ESTORE:
    return "SL_ESTORE: the state directory cannot be used";
  case SL_ECORRUPT:
    return "SL_ECORRUPT: stored data failed its checksum";
  case SL_EHASSTATE:
    return "SL_EHASSTATE: the state directory holds checkpoints; resume or "
           "start fresh";
  case SL_ECHECKPOINT:
    return "SL_ECHECKPOINT: too many consecutive checkpoints failed";
  case SL_ENOTFOUND:
    return "SL_ENOTFOUND: no such entry";
  case SL_EINJECTED:
    return "SL_EINJECTED: an injected fault fired";
  default:
    break;
  }
  if (status <= MDB_KEYEXIST && status >= MDB_LAST_ERRCODE)
    return mdb_strerror(status); /* LMDB's own range */
  if (status > 0)
    return strerror(status); /* glibc's strerror is thread-safe for known codes */
  if (status < 0 && status > -4096)
    return strerror(-status); /* a callback returning -errno */
  return "unknown error";
}
