/*-------------------------------------------------------------------------
 *
 * limits.h
 *	  Concurrency and rate limits kept in shared memory (limits.c), and the
 *	  wake-ups of waiting claims (wait.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_H
#define PGJQ_LIMITS_H

#include "engine/storage.h"

/* limits.c */
extern Size pgjq_limits_shmem_size(void);
extern void pgjq_limits_shmem_init(bool found);
extern void pgjq_limits_startup(void);
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

/* wait.c */
#define PGJQ_WAIT_MAX_QUEUES 32
extern Size pgjq_wait_shmem_size(void);
extern void pgjq_wait_shmem_init(bool found);
extern void pgjq_wait_startup(void);
extern void pgjq_wait_register(int nqueues, const int32 *queue_ids, bool await);
extern void pgjq_wait_rearm(void);
extern void pgjq_wait_sleep(TimestampTz until);
extern uint32 pgjq_wait_woken(void);
extern void pgjq_wait_used(uint32 queues);
extern void pgjq_wait_leaving_ready(void);
extern void pgjq_wait_unregister(void);
extern void pgjq_wait_note_ready(int32 queue_id, int n);
extern void pgjq_wait_note_claimed(int32 queue_id, int n);
extern void pgjq_wait_wake(Oid dboid, int32 queue_id, int n);
extern void pgjq_wait_note_finished(int64 id, char how);
extern void pgjq_wait_jobs_register(int n, const int64 *ids);
extern void pgjq_wait_jobs_unregister(void);
extern void pgjq_wait_jobs_sleep(TimestampTz until);

#endif							/* PGJQ_LIMITS_H */
