/* sluice_join.h — kept for programs written before issue 18: joins now
 * live in sluice_window.h, with windows. */
#include "sluice_window.h"
