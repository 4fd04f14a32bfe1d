/*-------------------------------------------------------------------------
 *
 * ring_shmem.h
 *	  The ring engine's shared state (ring_shmem.c): its allocation, and
 *	  what the other layers tell it (ring_internal.h has the rest, for the
 *	  ring's own files).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_SHMEM_H
#define PGJQ_RING_SHMEM_H

#include "common/pgjq_common.h"

/* allocation, called by src/pgjq.c's shared-memory hooks */
extern Size pgjq_ring_shmem_size(void);
extern void pgjq_ring_shmem_init(bool found);
extern void pgjq_ring_startup(void);

/* ERROR (55000, with a hint) unless the ring's shared memory exists */
extern void pgjq_ring_require(void);

/* alter_queue changed the queue's limits (lanes unparked at commit) */
extern void pgjq_ring_queue_altered(int32 queue_id);

/* limits.c: keys whose running count went down (never fails) */
extern void pgjq_ring_keys_freed(int n, const int32 *queue_ids, const uint64 *hashes);

/*
 * pgjq.job got n ready rows of a queue (an enqueue the ring had no room
 * for, a promotion likewise, retry of a dead job): the queue's claims must
 * look there again once this transaction commits (the engine's
 * pgjq_became_ready_hook, registered by _PG_init)
 */
extern void pgjq_ring_became_ready(int32 queue_id, int n);

#endif							/* PGJQ_RING_SHMEM_H */
