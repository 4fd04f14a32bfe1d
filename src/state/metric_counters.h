/*-------------------------------------------------------------------------
 *
 * metric_counters.h
 *	  Per-queue counters and histograms in shared memory (metric_counters.c):
 *	  what the API layer reports as it enqueues, claims and applies outcomes,
 *	  and what pgjq.metrics() (api/metrics.c) reads back.
 *
 * Every function here is a no-op without shared_preload_libraries.  Counts
 * are kept in the backend until the transaction commits (dropped if it or
 * the subtransaction that made them aborts), so they may be called at any
 * point of a pgjq call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_METRIC_COUNTERS_H
#define PGJQ_METRIC_COUNTERS_H

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

/* Histogram buckets: upper bounds in seconds, one more bucket for +Inf. */
#define PGJQ_METRICS_NBUCKETS 9
extern const double pgjq_metrics_bucket_le[PGJQ_METRICS_NBUCKETS];
extern const char *const pgjq_metrics_bucket_label[PGJQ_METRICS_NBUCKETS];

typedef struct PgjqMetricsHist
{
	uint64		buckets[PGJQ_METRICS_NBUCKETS + 1]; /* not cumulative; last:
													 * above 10 s */
	uint64		count;
	double		sum;			/* seconds */
} PgjqMetricsHist;

typedef struct PgjqMetricsKey
{
	Oid			dboid;
	Oid			incarnation;	/* OID of pgjq.job: a new CREATE EXTENSION
								 * starts over */
	int32		queue_id;		/* 0: no queue could be named */
} PgjqMetricsKey;

/* One queue's entry of the shared hash. */
typedef struct PgjqQueueMetrics
{
	PgjqMetricsKey key;
	uint64		counters[PGJQ_M_NCOUNTERS];
	PgjqMetricsHist wait;
	PgjqMetricsHist run;
} PgjqQueueMetrics;

/* shared memory (pgjq.c's shmem hooks) */
extern Size pgjq_metrics_shmem_size(void);
extern void pgjq_metrics_shmem_init(bool found);

/* the engine's events (wired by pgjq.c, each after limits.c's) */
extern void pgjq_metrics_storage_begin(void);
extern void pgjq_metrics_left_running(int32 queue_id);
extern void pgjq_metrics_jobs_finished(int32 queue_id, PgjqMetric m, int n);

/* what the API layer reports */
extern void pgjq_metrics_count(int32 queue_id, PgjqMetric m, int64 n);
extern void pgjq_metrics_claimed(int32 queue_id, int n, int64 token, TimestampTz at);
extern void pgjq_metrics_waited(int32 queue_id, int64 us);
extern void pgjq_metrics_call_begin(void);
extern void pgjq_metrics_job_outcome(int64 token, PgjqMetric m, TimestampTz now);
extern void pgjq_metrics_stale(int n, const Datum *tokens);
extern void pgjq_metrics_completed(int n, const Datum *tokens, int64 done, TimestampTz now);
extern void pgjq_metrics_queue_dropped(int32 queue_id);

/* reading (api/metrics.c) */
extern bool pgjq_metrics_available(void);
extern int	pgjq_metrics_copy_entries(int32 only, PgjqQueueMetrics **entries,
									  uint64 *overflow);

#endif							/* PGJQ_METRIC_COUNTERS_H */
