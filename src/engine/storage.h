/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  The narrow interface between pgjq's SQL API and its storage engine.
 *
 * The API layer (queue.c, enqueue.c, claim.c, outcome.c, maintenance.c)
 * validates arguments and decides semantics; only the storage_*.c files know
 * tables, indexes and SQL.  Replacing the engine means reimplementing this
 * header, not touching the API or its tests.
 *
 * Every function here must be called between pgjq_storage_begin() and
 * pgjq_storage_end() (an SPI connection), inside a transaction.  Results are
 * allocated in the memory context that was current at pgjq_storage_begin(),
 * so they survive pgjq_storage_end().
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_STORAGE_H
#define PGJQ_STORAGE_H

#include "common/pgjq.h"

#include "storage/lockdefs.h"
#include "utils/array.h"

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
 * Settings for create_queue/alter_queue; a negative value means "unset"
 * (and for the limits, 0 means "no limit").
 */
typedef struct PgjqQueueSettings
{
	int64		lease_us;
	int32		max_attempts;
	int64		backoff_base_us;
	int64		backoff_max_us;
	int64		retention_us;
	int32		concurrency;
	int32		key_concurrency;
	double		rate;
	int32		burst;
	int64		timeout_us;		/* 0 removes the deadline */
	double		key_rate;
	int32		key_burst;
} PgjqQueueSettings;

/*
 * How many jobs of a fair key a claim may take: reserve() is asked before a
 * round with how many the round may pick and returns how many it may
 * (reserving them); release() gives back part of a reservation before the
 * round; settle() is told afterwards how many were picked.  Set up
 * by the API layer from the queue's limits (limits.c).
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

/*
 * Engine events that shared-memory features follow; NULL without
 * shared_preload_libraries.  left_running: n jobs of (queue, fair_key) stop
 * running when the current transaction commits (fair_key NULL: the ring
 * knows only its pgjq_limits_key_hash, keyhash).  became_ready: n jobs of the
 * queue become claimable when it commits.
 */
typedef void (*PgjqLeftRunningHook) (int32 queue_id, const char *fair_key, uint64 keyhash,
									 int n);
typedef void (*PgjqBecameReadyHook) (int32 queue_id, int n);
extern PgjqLeftRunningHook pgjq_left_running_hook;
extern PgjqBecameReadyHook pgjq_became_ready_hook;

/*
 * n jobs of the queue reached a final state (PGJQ_FINISHED_*) in the current
 * transaction: complete, dead, cancelled.  For the counters of metrics.c;
 * NULL without shared_preload_libraries.
 */
typedef void (*PgjqJobsFinishedHook) (int32 queue_id, char state, int n);
extern PgjqJobsFinishedHook pgjq_jobs_finished_hook;

/*
 * Called by pgjq_storage_begin() before any statement of the call: limits.c
 * counts the running jobs there when its counters are not built yet, which
 * must happen before the call changes a job.
 */
typedef void (*PgjqStorageBeginHook) (void);
extern PgjqStorageBeginHook pgjq_storage_begin_hook;

/* Jobs to enqueue: arrays of n, plus values shared by all of them. */
typedef struct PgjqNewJobs
{
	int			n;
	int64	   *ids;			/* out: new or existing (dedup) job ids */
	Datum	   *payloads;		/* jsonb */
	Datum	   *fair_keys;		/* text, or NULL pointer for all-default */
	bool	   *fair_key_nulls;
	Datum	   *dedup_keys;		/* text, or NULL pointer for none */
	bool	   *dedup_key_nulls;
	int16		priority;
	int32		max_attempts;
	int64		timeout_us;		/* the jobs' own execution deadline; 0: the
								 * queue's */
	char		dedup_scope;	/* of the keyed jobs: 'w' their key is held
								 * until a claim; 0 until they end */
	TimestampTz enqueued_at;
	TimestampTz run_at;
	/* anchors only (state 'n', no payload): the ring holds the jobs */
	bool		anchors;
	bool		ids_given;		/* ids holds the new jobs' ids (drawn by the
								 * caller, no dedup_keys) */
	bool	   *created;		/* out, if set: position i is a new job (else
								 * a dedup_key found the job it has) */
} PgjqNewJobs;

typedef struct PgjqClaimedJob
{
	int64		id;
	int64		token;			/* fencing token of this claim */
	TimestampTz lease_until;	/* set by the API layer */
	int32		attempt;
	Datum		payload;		/* jsonb */
	Datum		fair_key;		/* text; 0 when the job has no key */
	int16		priority;
	TimestampTz enqueued_at;
} PgjqClaimedJob;

/* A running job's facts that decide the outcome of a failure. */
typedef struct PgjqRunningJob
{
	int64		id;
	int64		token;
	int32		attempt;
	int32		max_attempts;
	bool		cancel_requested;
	int64		backoff_base_us;
	int64		backoff_max_us;
} PgjqRunningJob;

typedef enum PgjqCancelResult
{
	PGJQ_CANCEL_NOT_FOUND,
	PGJQ_CANCEL_DONE,
	PGJQ_CANCEL_REQUESTED
} PgjqCancelResult;

/* Final states as stored in job_history.state (completed jobs: job_done) */
#define PGJQ_FINISHED_DEAD		'd'
#define PGJQ_FINISHED_COMPLETED	'c' /* reported to the hook only */
#define PGJQ_FINISHED_CANCELLED	'x'

extern void pgjq_storage_begin(void);
extern void pgjq_storage_end(void);

/* this database's schema has the ring's tables (0.2.0); else ERROR with a hint */
extern bool pgjq_storage_schema_current(void);
extern void pgjq_storage_require_schema(void);

/* storage_queue.c */
extern void pgjq_storage_queue_lock(const char *name, LOCKMODE mode);
extern void pgjq_storage_queue_unlock(const char *name, LOCKMODE mode);
extern bool pgjq_storage_queue_get(const char *name, PgjqQueue *queue);
extern void pgjq_storage_queue_get_or_error(const char *name, PgjqQueue *queue);
extern bool pgjq_storage_queue_insert(const char *name, const PgjqQueueSettings *s);
extern void pgjq_storage_queue_update(int32 queue_id, const PgjqQueueSettings *s);
extern void pgjq_storage_queue_set_paused(int32 queue_id, bool paused);
extern void pgjq_storage_queue_delete(int32 queue_id);
extern int64 pgjq_storage_queue_purge(int32 queue_id);

/* storage_job.c */
extern void pgjq_storage_enqueue(int32 queue_id, PgjqNewJobs *jobs);
extern int64 pgjq_storage_next_token(void);
extern int64 pgjq_storage_next_job_id(void);
extern bool pgjq_storage_cancel_waiting(int64 id, const char *reason, TimestampTz now);

/* cancel of a job waiting in pgjq.job (scheduled, or ready outside the ring) */
extern PgjqCancelResult pgjq_storage_cancel(int64 id, TimestampTz now);

/* the ids that may be unfinished jobs of (queue, fair_key; "" none), sorted */
extern int	pgjq_storage_key_jobs(int32 queue_id, const char *fair_key, int64 **ids);
extern int64 pgjq_storage_retry_dead(int32 queue_id, ArrayType *ids, TimestampTz now);

/* outcome.c: the outcome of a failed attempt (fail, rescue), and applying it */
extern char pgjq_outcome_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
							  TimestampTz now);
extern char pgjq_outcome_rescue_ring(int64 id, int64 token, TimestampTz now);

/* outcome.c: the outcomes of a worker's cycle (complete_and_claim) */
extern int64 pgjq_outcome_cycle(int n, Datum *ids, Datum *tokens, Datum *errors,
								bool *error_nulls, Datum *results, bool *result_nulls,
								TimestampTz now);

/* outcome.c: a results argument (jsonb[]) checked; -1 when NULL or absent */
extern int	pgjq_outcome_results(FunctionCallInfo fcinfo, int argno, Datum **values,
								 bool **nulls);

/* storage_maintenance.c */
extern int64 pgjq_storage_promote(TimestampTz now, int limit);
extern TimestampTz pgjq_storage_next_deadline(void);

/* storage_verify.c: a durable invariant that does not hold (verify.c) */
typedef struct PgjqVerifyRow
{
	char	   *area;
	char	   *object;
	char	   *expected;
	char	   *found;
} PgjqVerifyRow;
extern int	pgjq_storage_verify(PgjqVerifyRow **rows);

/* storage_metrics.c: the gauges of metrics() for one queue or all */
typedef struct PgjqQueueGauges
{
	int32		queue_id;
	char	   *name;
	int64		ready;
	int64		scheduled;
	int64		running;
	int64		dead;
	bool		has_oldest_ready;
	double		oldest_ready_age;	/* seconds */
	bool		has_next_scheduled;
	double		next_scheduled_in;	/* seconds, negative when overdue */
	int64		held_keys;		/* fair keys held (hold_key) until later */
	int64		waiting;		/* waiting for their dependencies */
} PgjqQueueGauges;
extern int	pgjq_storage_queue_gauges(int32 queue_id, TimestampTz now, PgjqQueueGauges **gauges);

/* storage_history.c */
extern void pgjq_history_ensure(TimestampTz ts);
#define PGJQ_DONE_NATTS 8
extern void pgjq_history_insert_done(const Datum *values, const bool *nulls);
extern void pgjq_history_prepare(TimestampTz now);
extern int64 pgjq_history_summarize(TimestampTz now);
extern int	pgjq_history_prune_one(TimestampTz now, int skip, int64 *pruned);
extern int64 pgjq_history_prune(TimestampTz now);

#endif							/* PGJQ_STORAGE_H */
