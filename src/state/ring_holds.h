/*-------------------------------------------------------------------------
 *
 * ring_holds.h
 *	  The held fair keys in shared memory (ring_holds.c), as a waiting claim
 *	  sees them; the ring's own files use ring_internal.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_HOLDS_H
#define PGJQ_RING_HOLDS_H

#include "common/pgjq_common.h"

/* the earliest end of a hold in this database (DT_NOEND: none) */
extern TimestampTz pgjq_ring_hold_next(void);

#endif							/* PGJQ_RING_HOLDS_H */
