/*-------------------------------------------------------------------------
 *
 * ring_xact.h
 *	  The ring's transaction callbacks (ring_xact.c): their registration,
 *	  and what the other layers note for them to do when the transaction
 *	  commits (ring_internal.h has the rest, for the ring's own files).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_XACT_H
#define PGJQ_RING_XACT_H

#include "common/pgjq_common.h"

/* registers the callbacks and the drop hook, called by _PG_init */
extern void pgjq_ring_startup(void);

/* alter_queue changed the queue's limits (lanes unparked at commit) */
extern void pgjq_ring_queue_altered(int32 queue_id);

/*
 * pgjq.job got n ready rows of a queue (an enqueue the ring had no room
 * for, a promotion likewise, retry of a dead job): the queue's claims must
 * look there again once this transaction commits (the engine's
 * pgjq_became_ready_hook, registered by _PG_init)
 */
extern void pgjq_ring_became_ready(int32 queue_id, int n);

#endif							/* PGJQ_RING_XACT_H */
