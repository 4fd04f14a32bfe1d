/*-------------------------------------------------------------------------
 *
 * limits.h
 *	  The counters of the concurrency and rate limits, kept in shared
 *	  memory (limits.c).  What a claim may take is in limits_claim.h,
 *	  verify()'s check in limits_verify.h.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_H
#define PGJQ_LIMITS_H

#include "common/queue_types.h"

/* limits.c */
extern Size pgjq_limits_shmem_size(void);
extern void pgjq_limits_shmem_init(bool found);
extern void pgjq_limits_require_shmem(const char *what);
extern void pgjq_limits_rebuild_if_needed(void);
extern void pgjq_limits_queue_dropped(int32 queue_id);
extern uint64 pgjq_limits_key_hash(const char *fair_key, int len);

/*
 * The storage engine's left_running and begin hooks (engine.h), registered
 * by _PG_init: n jobs of (queue, key) stop running at commit; a call
 * enters the engine (the counters are built first if they must be)
 */
extern void pgjq_limits_left_running(int32 queue_id, const char *fair_key, uint64 keyhash,
									 int n);
extern void pgjq_limits_storage_begin(void);

/*
 * What the counters need from the ring, set by _PG_init: its running jobs
 * per (queue, key hash) of one queue or (0) all, in palloc'd arrays
 * (engine's pgjq_ring_running_keys); keys whose running count went down,
 * so that their lanes come back (state's pgjq_ring_keys_freed, never
 * fails), called with no lock held
 */
typedef int (*PgjqLimitsRunningKeysHook) (int32 queue_id, int32 **qids, uint64 **hashes,
										  int64 **counts);
typedef void (*PgjqLimitsKeysFreedHook) (int n, const int32 *queue_ids, const uint64 *hashes);
extern PgjqLimitsRunningKeysHook pgjq_limits_running_keys_hook;
extern PgjqLimitsKeysFreedHook pgjq_limits_keys_freed_hook;

#endif							/* PGJQ_LIMITS_H */
