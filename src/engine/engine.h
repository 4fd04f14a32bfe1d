/*-------------------------------------------------------------------------
 *
 * engine.h
 *	  The interface between pgjq's SQL API and its storage engine: every
 *	  store operation the api layer (and the worker) uses, the ring's
 *	  (the ring_*.c files) and pgjq.job's with its history (storage_*.c).
 *
 * The API layer (queue.c, enqueue.c, claim.c, outcome.c, maintenance.c)
 * validates arguments and decides semantics; only the engine's files know
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
#ifndef PGJQ_ENGINE_H
#define PGJQ_ENGINE_H

#include "common/queue_types.h"

#include "storage/lockdefs.h"
#include "utils/array.h"

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
 * transaction: complete, dead, cancelled.  For the metric counters
 * (state/metric_counters.c, set by pgjq.c); NULL without
 * shared_preload_libraries.
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

/* a promotion in flight (held to its end); waiting until none is */
extern void pgjq_storage_promotion_lock(void);
extern void pgjq_storage_promotions_wait(void);
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

/* whether this node holds job id in any state (the Citus id guard) */
extern bool pgjq_storage_job_here(int64 id);

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

/* ---------------------------------------------------------------------
 * the ring engine (docs/design.md, "The ring engine"; ring.h)
 * --------------------------------------------------------------------- */

/*
 * Whether the ring has positions for n more ready jobs, with headroom
 * (1/16 of pgjq.ring_positions) for producers that ask at the same time;
 * when it has not, enqueue stores the jobs in pgjq.job instead (claims find
 * them there), so a backlog beyond the ring's shared memory is slower, not
 * refused.  True without the preload (the ring's calls then say what is
 * missing).
 */
extern bool pgjq_ring_has_room(int n);

/* ring_*.c: the engine's operations, between pgjq_storage_begin/end */
extern void pgjq_ring_enqueue(int32 queue_id, int32 max_attempts, PgjqNewJobs *jobs);
extern int	pgjq_ring_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
							const char *worker, PgjqClaimQuota *quota, int64 *token,
							PgjqClaimedJob *jobs);

/*
 * Whether a claim of the queue should move ready rows of pgjq.job into the
 * ring first: it may have some.  *gen is what to pass to
 * pgjq_ring_table_empty when it then had none.
 */
extern bool pgjq_ring_table_first(int32 queue_id, uint64 *gen);
extern void pgjq_ring_table_empty(int32 queue_id, uint64 gen);

/*
 * Complete the pairs that are jobs in flight (the others are stale).
 * results (jsonb, NULL pointer for none; an element with result_nulls[i]
 * set has none) are kept with the completed jobs in job_done.  Returns how
 * many it completed.
 */
extern int64 pgjq_ring_complete(int n, Datum *ids, Datum *tokens, const Datum *results,
								const bool *result_nulls, TimestampTz now);

/* what became of (id, token) */
#define PGJQ_RING_NOT_MINE	0	/* not a job in flight */
#define PGJQ_RING_STALE		1	/* a ring job, but the token is stale */

/*
 * Extend the lease of (id, token) to now + extend_us (the queue's lease when
 * negative), but not past its claim's deadline (the queue's timeout), if it
 * is a ring job in flight: PGJQ_RING_EXTENDED (*lease_until set),
 * PGJQ_RING_CANCELLED (its cancellation was requested: it ended as
 * cancelled), PGJQ_RING_TIMED_OUT (its deadline has passed: nothing
 * changes, rescue ends the attempt), PGJQ_RING_STALE, or PGJQ_RING_NOT_MINE.
 */
#define PGJQ_RING_EXTENDED	3
#define PGJQ_RING_CANCELLED	5
#define PGJQ_RING_TIMED_OUT	6

/* the execution deadline of (id, token) in flight; 0 if none or not in flight */
extern TimestampTz pgjq_ring_deadline(int64 id, int64 token);

/*
 * fail (snooze_until 0) or snooze of (id, token) if it is a ring job in
 * flight, without moving it first; lease_before (rescue): only if its lease
 * ends before that.  PGJQ_RING_FAILED with *outcome ('s': scheduled at
 * *run_at in pgjq.job; or PGJQ_FINISHED_DEAD), PGJQ_RING_STALE, or
 * PGJQ_RING_NOT_MINE.
 */
#define PGJQ_RING_FAILED	4
extern int	pgjq_ring_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
						   TimestampTz snooze_until, TimestampTz lease_before,
						   TimestampTz now, char *outcome, TimestampTz *run_at);
extern int	pgjq_ring_heartbeat(int64 id, int64 token, int64 extend_us, TimestampTz now,
								TimestampTz *lease_until);

/*
 * due jobs from pgjq.job into the ring (maintenance.c); ready rows of a
 * queue into the ring (a claim: *left, some may be left)
 */
extern int64 pgjq_ring_promote(TimestampTz now, int limit);
extern int64 pgjq_ring_promote_ready(int32 queue_id, int limit, bool *left);
extern void pgjq_ring_refusals(int64 *n, TimestampTz *at, const char **bound);

/*
 * cancel of a ring job in flight: its cancellation is requested (true); of
 * a ready one: it ends as cancelled (true); false if it is neither
 */
extern bool pgjq_ring_request_cancel(int64 id);

/* cancel of a ready ring job: it ends as cancelled; false if none */
extern bool pgjq_ring_take_ready(int64 id);

/* a claim of the queue could take a ring job now (a lane not parked) */
extern bool pgjq_ring_claimable(int32 queue_id);

/* one step of giving space back: truncation, or relocation of stragglers */
#define PGJQ_RING_RECLAIM_MAX 100000
extern int64 pgjq_ring_reclaim(int limit);

/* ring claims whose lease ended before now (at most limit) */
extern int	pgjq_ring_expired(TimestampTz now, int limit, int64 *ids, int64 *tokens);
extern TimestampTz pgjq_ring_next_deadline(void);

/*
 * purge (drop false): end the queue's ready ring jobs.  drop_queue (drop
 * true): the same, and with force its running ones too; without force,
 * nothing changes when it has running ones.  Waits for open transactions
 * that claim or finish the queue's ring jobs.  Returns how many running ring
 * jobs the queue has, *ready how many ready ones it ended.
 */
extern int64 pgjq_ring_drop_jobs(int32 queue_id, bool drop, bool force, int64 *ready);

/* verify(): where shared memory and the ring's tables disagree */
extern int	pgjq_ring_verify(PgjqVerifyRow **rows);

/*
 * the ring's ready and running jobs of a queue, and when its oldest ready
 * job was enqueued (0: none), from shared memory; committed: as the
 * committed state says (a claim still open leaves its jobs ready), else as
 * a claim would find them now
 */
extern void pgjq_ring_counts(int32 queue_id, bool committed, int64 *ready, int64 *running,
							 TimestampTz *oldest);

/* the job's queue and fair key ("" for none) if (id, token) is in flight */
extern bool pgjq_ring_job_key(int64 id, int64 token, int32 *queue_id, char **fair_key);

/*
 * key_holds.c: hold a fair key of a queue until a time (claims skip its
 * ready ring jobs without touching them), or release it.  Both take effect
 * when the transaction commits; the durable row is pgjq.key_holds.
 */
extern void pgjq_key_hold(int32 queue_id, const char *fair_key, TimestampTz until);
extern bool pgjq_key_release(int32 queue_id, const char *fair_key);

/* dedup.c: enqueue's dedup options, and pruning the dedup_for keys */
typedef struct PgjqDedup
{
	char		scope;			/* 0 until the job ends ('unfinished'), 'w'
								 * until its claim ('waiting'), 'p' for for_us
								 * from its enqueue */
	int64		for_us;
	bool		replace;		/* on_duplicate => 'replace' */
	int64		debounce_max_us;	/* 0: no bound */
} PgjqDedup;

/*
 * The four arguments from argno on (dedup_scope, dedup_for, on_duplicate,
 * debounce_max); keyed: the call has a dedup_key (keys_arg names it).
 */
extern void pgjq_dedup_args(FunctionCallInfo fcinfo, int argno, bool keyed,
							const char *keys_arg, PgjqDedup *d);

typedef void (*PgjqStoreJobs) (const PgjqQueue *queue, PgjqNewJobs *jobs);

/*
 * Store the jobs as store() does, with the dedup options: jobs->ids[i] is
 * the new job's id, or that of the job holding its key (whose payload and
 * run_at a replace changed, if it was still waiting).  Between
 * pgjq_storage_begin and end.
 */
extern void pgjq_dedup_store(const PgjqQueue *queue, PgjqNewJobs *jobs, const PgjqDedup *d,
							 PgjqStoreJobs store);

/* Delete up to limit dedup_for keys that ended before now; returns how many. */
extern int64 pgjq_dedup_prune(TimestampTz now, int limit);

/* deps.c: enqueue(..., after), and the worker's release of waiting jobs */
/* One new job's dependencies: existing job ids and earlier positions of the call. */
typedef struct PgjqJobDeps
{
	int			n;
	int64	   *ids;			/* existing jobs (n_ids of them) */
	int			n_ids;
	int		   *positions;		/* 0-based positions of the same call, each
								 * before this job's */
	int			n_positions;
} PgjqJobDeps;

extern char pgjq_deps_failure_arg(FunctionCallInfo fcinfo, int argno);
extern void pgjq_deps_enqueue(const PgjqQueue *queue, PgjqNewJobs *jobs, PgjqJobDeps *deps,
							  char on_failure, PgjqStoreJobs store);
extern int64 pgjq_deps_resolve_chunk(void);
extern int64 pgjq_deps_resolve_all(void);

#endif							/* PGJQ_ENGINE_H */
