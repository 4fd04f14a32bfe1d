/*-------------------------------------------------------------------------
 *
 * ring_records.h
 *	  The ring engine's shared records (ring_records.c), as limits.c tells
 *	  them that keys have room again; the ring's own files use
 *	  ring_internal.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_RECORDS_H
#define PGJQ_RING_RECORDS_H

#include "common/pgjq_common.h"

/* limits.c: keys whose running count went down (never fails) */
extern void pgjq_ring_keys_freed(int n, const int32 *queue_ids, const uint64 *hashes);

#endif							/* PGJQ_RING_RECORDS_H */
