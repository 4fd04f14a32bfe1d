/*-------------------------------------------------------------------------
 *
 * metrics.h
 *	  Counters in shared memory for pgjq.metrics() (metrics.c): what the
 *	  API layer reports as it enqueues, claims and applies outcomes.
 *
 * Every function here is a no-op without shared_preload_libraries.  Counts
 * are kept in the backend until the transaction commits (dropped if it or
 * the subtransaction that made them aborts), so they may be called at any
 * point of a pgjq call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_METRICS_H
#define PGJQ_METRICS_H

#include "common/pgjq_common.h"

/* The per-queue counters, in the order metrics() shows them. */
typedef enum PgjqMetric
{
	PGJQ_M_ENQUEUED,
	PGJQ_M_CLAIMED,
	PGJQ_M_COMPLETED,
	PGJQ_M_FAILED,				/* fail() that scheduled a retry */
	PGJQ_M_DEAD,
	PGJQ_M_RESCUED,				/* leases that expired */
	PGJQ_M_CANCELLED,
	PGJQ_M_SNOOZED,
	PGJQ_M_STALE,				/* outcomes whose token no longer matched */
	PGJQ_M_HELD_CONCURRENCY,	/* claims held back, by limit */
	PGJQ_M_HELD_KEY,
	PGJQ_M_HELD_RATE,
	PGJQ_M_HELD_PAUSED,
	PGJQ_M_HELD_KEY_RATE,
	PGJQ_M_RUN_UNKNOWN,			/* outcomes whose claim time was not known */
	PGJQ_M_NCOUNTERS
} PgjqMetric;

extern Size pgjq_metrics_shmem_size(void);
extern void pgjq_metrics_shmem_init(bool found);
extern void pgjq_metrics_startup(void);

extern void pgjq_metrics_count(int32 queue_id, PgjqMetric m, int64 n);
extern void pgjq_metrics_claimed(int32 queue_id, int n, int64 token, TimestampTz at);
extern void pgjq_metrics_waited(int32 queue_id, int64 us);
extern void pgjq_metrics_call_begin(void);
extern void pgjq_metrics_job_outcome(int64 token, PgjqMetric m, TimestampTz now);
extern void pgjq_metrics_stale(int n, const Datum *tokens);
extern void pgjq_metrics_completed(int n, const Datum *tokens, int64 done, TimestampTz now);
extern void pgjq_metrics_queue_dropped(int32 queue_id);

#endif							/* PGJQ_METRICS_H */
