/* sluice_join.h — joins of two keyed streams: windowed, interval and unbounded
 * (operators/join.c).  Included by sluice.h. */
#ifndef SLUICE_JOIN_H
#define SLUICE_JOIN_H

#include "sluice.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif /* SLUICE_JOIN_H */
