/*-------------------------------------------------------------------------
 *
 * limits_claim.h
 *	  What a claim may take under its queue's concurrency, rate and key
 *	  limits, and await()'s readings of them (limits_claim.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_CLAIM_H
#define PGJQ_LIMITS_CLAIM_H

#include "common/queue_types.h"

/* limits_claim.c */
extern bool pgjq_queue_has_limits(const PgjqQueue *queue);
extern int	pgjq_limits_reserve_queue(const PgjqQueue *queue, int want, int64 *token_in_us);
extern bool pgjq_limits_queue_full(int32 queue_id, int32 concurrency);
extern void pgjq_limits_settle_queue(const PgjqQueue *queue, int reserved, int used);
extern void pgjq_limits_init_quota(PgjqClaimQuota *quota, const PgjqQueue *queue);
extern bool pgjq_limits_quota_cut_short(PgjqClaimQuota *quota);
extern void pgjq_limits_note_held_back(int32 queue_id);
extern bool pgjq_limits_key_full(int32 queue_id, const char *fair_key, int32 key_concurrency);
extern void pgjq_limits_reserve_room(int n);
extern int	pgjq_limits_ring_key_take(PgjqClaimQuota *quota, uint64 keyhash);
extern void pgjq_limits_counters_full(void);
extern void pgjq_limits_quota_held(PgjqClaimQuota *quota);
extern void pgjq_limits_ring_settle(const PgjqQueue *queue, int n, const uint64 *hashes);
extern int64 pgjq_limits_next_token_us(const PgjqQueue *queue);

#endif							/* PGJQ_LIMITS_CLAIM_H */
