/*-------------------------------------------------------------------------
 *
 * limits_verify.h
 *	  verify()'s check of the limit counters against the running jobs
 *	  (limits_verify.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_VERIFY_H
#define PGJQ_LIMITS_VERIFY_H

#include "common/pgjq_common.h"

/* A counter that disagrees with pgjq.job (verify.c) */
typedef struct PgjqLimitsDiff
{
	int32		queue_id;
	char	   *fair_key;		/* NULL: the queue's own count */
	int32		expected;		/* running jobs in the table */
	int32		found;			/* the counter */
} PgjqLimitsDiff;

/* limits_verify.c */
extern int	pgjq_limits_verify(PgjqLimitsDiff **diffs);

#endif							/* PGJQ_LIMITS_VERIFY_H */
