/*-------------------------------------------------------------------------
 *
 * ring_shmem.h
 *	  The ring engine's shared memory (ring_shmem.c): its allocation, and
 *	  whether it exists.  ring_records.h and ring_xact.h have what the other
 *	  layers tell the ring; ring_internal.h the rest, for the ring's own
 *	  files.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_SHMEM_H
#define PGJQ_RING_SHMEM_H

#include "common/pgjq_common.h"

/* allocation, called by src/pgjq.c's shared-memory hooks */
extern Size pgjq_ring_shmem_size(void);
extern void pgjq_ring_shmem_init(bool found);

/* ERROR (55000, with a hint) unless the ring's shared memory exists */
extern void pgjq_ring_require(void);

#endif							/* PGJQ_RING_SHMEM_H */
