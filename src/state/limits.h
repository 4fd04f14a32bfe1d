/*-------------------------------------------------------------------------
 *
 * limits.h
 *	  Concurrency and rate limits kept in shared memory (limits.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_H
#define PGJQ_LIMITS_H

#include "common/queue_types.h"

/* limits.c */
extern Size pgjq_limits_shmem_size(void);
extern void pgjq_limits_shmem_init(bool found);
extern bool pgjq_queue_has_limits(const PgjqQueue *queue);
extern void pgjq_limits_require_shmem(const char *what);
extern int	pgjq_limits_reserve_queue(const PgjqQueue *queue, int want, int64 *token_in_us);
extern bool pgjq_limits_queue_full(int32 queue_id, int32 concurrency);
extern void pgjq_limits_settle_queue(const PgjqQueue *queue, int reserved, int used);
extern void pgjq_limits_rebuild_if_needed(void);
extern void pgjq_limits_init_quota(PgjqClaimQuota *quota, const PgjqQueue *queue);
extern bool pgjq_limits_quota_cut_short(PgjqClaimQuota *quota);
extern void pgjq_limits_note_held_back(int32 queue_id);
extern void pgjq_limits_queue_dropped(int32 queue_id);
extern bool pgjq_limits_key_full(int32 queue_id, const char *fair_key, int32 key_concurrency);
extern uint64 pgjq_limits_key_hash(const char *fair_key, int len);
extern void pgjq_limits_reserve_room(int n);
extern int	pgjq_limits_ring_key_take(PgjqClaimQuota *quota, uint64 keyhash);
extern void pgjq_limits_counters_full(void);
extern void pgjq_limits_quota_held(PgjqClaimQuota *quota);
extern void pgjq_limits_ring_settle(const PgjqQueue *queue, int n, const uint64 *hashes);
extern int64 pgjq_limits_next_token_us(const PgjqQueue *queue);

/* A counter that disagrees with pgjq.job (verify.c) */
typedef struct PgjqLimitsDiff
{
	int32		queue_id;
	char	   *fair_key;		/* NULL: the queue's own count */
	int32		expected;		/* running jobs in the table */
	int32		found;			/* the counter */
} PgjqLimitsDiff;
extern int	pgjq_limits_verify(PgjqLimitsDiff **diffs);

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
