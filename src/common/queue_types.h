/*-------------------------------------------------------------------------
 *
 * queue_types.h
 *	  A queue's settings as the stores read them (PgjqQueue) and the quota
 *	  of a claim (PgjqClaimQuota): data types that the limits in shared
 *	  memory (state), the stores (engine) and the SQL functions (api) pass
 *	  to each other.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_QUEUE_TYPES_H
#define PGJQ_QUEUE_TYPES_H

#include "common/pgjq_common.h"

typedef struct PgjqQueue
{
	int32		queue_id;
	int64		lease_us;
	int32		max_attempts;
	int64		backoff_base_us;
	int64		backoff_max_us;
	int64		retention_us;
	int32		concurrency;	/* 0 = no limit */
	int32		key_concurrency;	/* 0 = no limit */
	double		rate;			/* claims started per second; 0 = no limit */
	int32		burst;			/* bucket size for rate */
	bool		paused;
	int64		timeout_us;		/* execution deadline from the claim; 0 = none */
	double		key_rate;		/* claims per second per fair key; 0 = none */
	int32		key_burst;		/* its bucket size */
} PgjqQueue;

/*
 * How many jobs of a fair key a claim may take: reserve() is asked before a
 * round with how many the round may pick and returns how many it may
 * (reserving them); release() gives back part of a reservation before the
 * round; settle() is told afterwards how many were picked.  Set up
 * by the API layer from the queue's limits (limits_claim.c).
 */
typedef struct PgjqClaimQuota
{
	int			(*reserve) (struct PgjqClaimQuota *quota, const char *fair_key, int want);
	void		(*settle) (struct PgjqClaimQuota *quota, const char *fair_key, int reserved, int picked);
	void		(*release) (struct PgjqClaimQuota *quota, const char *fair_key, int n);
	const PgjqQueue *queue;
	bool		per_key_limit;	/* false: reserve() grants all, settle()
								 * counts */
	bool		key_rate_cut;	/* out: a key's key_rate held jobs back */
	void	   *state;
} PgjqClaimQuota;

#endif							/* PGJQ_QUEUE_TYPES_H */
