/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  SQL API: claim(queue | queues[], batch, lease, worker, wait), the fused
 *	  complete_and_claim(queue, ids, tokens, batch, lease, worker, errors)
 *	  and the procedure await(queues[], wait).
 *
 * Leases up to `batch` ready jobs in fair order (engine/ring_claim.c), from the
 * queues in the order given, within each queue's limits (limits.c), and
 * returns them as pgjq.claimed rows.  Every claim call that leases a job
 * draws one new fencing token from a sequence (never reused, not even after
 * a rollback); all jobs of the call carry it.  Each queue's jobs get that
 * queue's lease (or the lease argument).  Paused queues give nothing.
 *
 * With `wait`, a call that finds nothing sleeps until a producer's commit
 * makes a job of one of its queues claimable, or the wait (capped by
 * pgjq.max_wait) ends; query cancel and statement_timeout interrupt it
 * (wait.c).  When a rate limit cut a claim that had jobs, it also wakes
 * when the next token is due (an empty queue does not make it poll).  A
 * claim notes for wait.c the jobs it took (ready again if it aborts).  A
 * waiting call holds its statement's snapshot, and so the xmin horizon;
 * await() waits without one.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "common/args.h"
#include "state/limits.h"
#include "state/limits_claim.h"
#include "state/metric_counters.h"
#include "common/spi_plans.h"
#include "api/outcome.h"
#include "common/guc.h"
#include "engine/engine.h"
#include "state/ring_holds.h"
#include "state/wait.h"
#include "state/worker_slots.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(pgjq_claim);
PG_FUNCTION_INFO_V1(pgjq_claim_many);
PG_FUNCTION_INFO_V1(pgjq_await);

/* The queue names of argument 0: one text, or a text[] without nulls. */
static char **
queue_names(FunctionCallInfo fcinfo, bool many, int *n)
{
	char	  **names;

	if (!many)
	{
		names = palloc(sizeof(char *));
		names[0] = pgjq_arg_queue_name(fcinfo, 0);
		*n = 1;
		return names;
	}
	{
		ArrayType  *arr = pgjq_arg_array(fcinfo, 0, "queues", TEXTOID, true);
		Datum	   *elems;
		bool	   *nulls;

		*n = pgjq_array_length(arr);
		if (*n == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("queues must not be empty")));
		if (*n > PGJQ_WAIT_MAX_QUEUES)
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("queues has too many elements"),
					 errdetail("A claim takes at most %d queues.", PGJQ_WAIT_MAX_QUEUES)));
		deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, n);
		names = palloc(sizeof(char *) * *n);
		for (int i = 0; i < *n; i++)
		{
			LOCAL_FCINFO(one, 1);

			if (nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("queues must not contain nulls")));
			/* reuse the single-name checks */
			InitFunctionCallInfoData(*one, NULL, 1, InvalidOid, NULL, NULL);
			one->args[0].value = elems[i];
			one->args[0].isnull = false;
			names[i] = pgjq_arg_queue_name(one, 0);
		}
	}
	return names;
}

/*
 * Checks the guard of each queue (call: PGJQ_GUARD_CLAIM, or
 * PGJQ_GUARD_CYCLE for complete_and_claim's claim) and reads it.  Returns
 * bit i set for each queue that is served but of which no job may be handed
 * out now (a move's last phase, for a CYCLE call).
 */
static uint32
lookup_queues(char **names, int n, PgjqQueue *queues, PgjqGuardCall call)
{
	uint32		withheld = 0;

	for (int i = 0; i < n; i++)
	{
		if (!pgjq_guard_claim(names[i], call))
			withheld |= (uint32) 1 << i;
		pgjq_storage_queue_get_or_error(names[i], &queues[i]);
	}
	return withheld;
}

/*
 * Up to granted jobs of one queue from the ring.  While pgjq.job may hold
 * ready rows of the queue (a backlog that found the ring full, redriven
 * dead jobs, a promotion the ring had no room for, 0.1.0's ready jobs after
 * the update: ring.h), up to granted of them move into the ring first, and
 * the flag is cleared once none is left.
 */
static int
queue_claim(const PgjqQueue *q, int granted, TimestampTz lease_until, const char *worker,
			PgjqClaimQuota *quota, int64 *token, PgjqClaimedJob *jobs, bool *moved)
{
	uint64		gen;

	*moved = false;
	if (pgjq_ring_table_first(q->queue_id, &gen))
	{
		bool		left;

		*moved = pgjq_ring_promote_ready(q->queue_id, granted, &left) > 0;
		if (!left)
			pgjq_ring_table_empty(q->queue_id, gen);
	}
	return pgjq_ring_claim(q, granted, lease_until, worker, quota, token, jobs);
}

/*
 * One claim attempt over all queues, in order, in its own SPI session.
 * Returns how many jobs it leased into jobs[]; queues[] is the caller's
 * room for nqueues entries.  *examined gets bit i for each queue it looked
 * at (those after the batch filled up are not).  *retry_in_us is lowered to
 * when the next rate token is due if a rate limit held back jobs that are
 * there.
 */
static int
claim_once(char **names, int nqueues, int batch, int64 lease_us, const char *worker,
		   PgjqGuardCall call, PgjqQueue *queues, PgjqClaimedJob *jobs, int32 *queue_ids,
		   uint32 *examined, int64 *retry_in_us)
{
	int			n = 0;
	uint32		withheld;
	int64		token = 0;

	*examined = 0;
	pgjq_storage_begin();

	/*
	 * The queue-name lock in shared mode, as producers take it: drop_queue
	 * (exclusive) waits for a claim in flight and then counts what it took as
	 * running, and a claim that waited sees the drop.  An attempt that takes
	 * and moves nothing of a queue gives its lock back at once, so a waiting
	 * claim does not hold up a drop (nor the producers queued behind it).
	 */
	for (int i = 0; i < nqueues; i++)
		pgjq_storage_queue_lock(names[i], RowExclusiveLock);
	withheld = lookup_queues(names, nqueues, queues, call);
	for (int i = 0; i < nqueues; i++)
	{
		PgjqQueue  *q = &queues[i];
		PgjqClaimQuota quota;
		int			want = batch - n;
		int			granted;
		int			got;
		int64		token_in_us;
		TimestampTz lease_until;
		TimestampTz claim_at;
		bool		moved;

		queue_ids[i] = q->queue_id;
		if (want <= 0)
		{
			pgjq_storage_queue_unlock(names[i], RowExclusiveLock);
			continue;
		}
		*examined |= (uint32) 1 << i;
		if (withheld & ((uint32) 1 << i))
		{
			pgjq_storage_queue_unlock(names[i], RowExclusiveLock);
			continue;
		}
		if (q->paused)
		{
			pgjq_metrics_count(q->queue_id, PGJQ_M_HELD_PAUSED, 1);
			pgjq_storage_queue_unlock(names[i], RowExclusiveLock);
			continue;
		}
		granted = pgjq_limits_reserve_queue(q, want, &token_in_us);
		if (granted == 0)
		{
			/*
			 * An empty bucket (token_in_us set) was emptied by claims that
			 * had jobs: wait for the next token.  If the queue is empty by
			 * then, that attempt is granted a token, takes nothing, and the
			 * wait goes on to a commit or its end.
			 */
			if (token_in_us > 0 && (*retry_in_us == 0 || token_in_us < *retry_in_us))
				*retry_in_us = token_in_us;
			pgjq_limits_note_held_back(q->queue_id);
			pgjq_metrics_count(q->queue_id, token_in_us > 0 ? PGJQ_M_HELD_RATE :
							   PGJQ_M_HELD_CONCURRENCY, 1);
			pgjq_storage_queue_unlock(names[i], RowExclusiveLock);
			continue;
		}
		pgjq_limits_init_quota(&quota, q);
		claim_at = GetCurrentTimestamp();
		lease_until = claim_at + (lease_us > 0 ? lease_us : q->lease_us);

		/*
		 * If this (sub)transaction aborts, the jobs the claim took are ready
		 * again: wake waiters then.  Noted before the claim (at most
		 * granted), for an error in it, and set to what it took after.
		 */
		pgjq_wait_note_claimed(q->queue_id, granted);
		got = queue_claim(q, granted, lease_until, worker, &quota, &token, jobs + n, &moved);
		if (got == 0 && !moved)
			pgjq_storage_queue_unlock(names[i], RowExclusiveLock);

		/*
		 * the worker rescues the leases on time if one ends before its
		 * wake-up (the ring's leases: a timeout may have cut them short)
		 */
		if (got > 0)
		{
			TimestampTz first = jobs[n].lease_until;

			for (int k = n + 1; k < n + got; k++)
				first = Min(first, jobs[k].lease_until);
			pgjq_shmem_note_due(first);
		}

		pgjq_wait_note_claimed(q->queue_id, got - granted);
		pgjq_limits_settle_queue(q, granted, got);
		/* held back: a limit, not the supply of ready jobs, stopped the claim */
		if ((got == granted && granted < want) || pgjq_limits_quota_cut_short(&quota) ||
			quota.key_rate_cut)
			pgjq_limits_note_held_back(q->queue_id);
		if (got == granted && granted < want)
			pgjq_metrics_count(q->queue_id, token_in_us > 0 ? PGJQ_M_HELD_RATE :
							   PGJQ_M_HELD_CONCURRENCY, 1);
		if (pgjq_limits_quota_cut_short(&quota))
			pgjq_metrics_count(q->queue_id, PGJQ_M_HELD_KEY, 1);
		if (quota.key_rate_cut)
			pgjq_metrics_count(q->queue_id, PGJQ_M_HELD_KEY_RATE, 1);
		if (got > 0)
			pgjq_metrics_claimed(q->queue_id, got, jobs[n].token, claim_at);
		/* the bucket cut a claim that had jobs: more may come with a token */
		if (token_in_us > 0 && got == granted &&
			(*retry_in_us == 0 || token_in_us < *retry_in_us))
			*retry_in_us = token_in_us;
		n += got;
	}
	pgjq_storage_end();
	return n;
}

/* The claimed jobs as pgjq.claimed rows of the materialized result. */
static void
put_claimed(ReturnSetInfo *rsinfo, const PgjqClaimedJob *jobs, int n)
{
	for (int i = 0; i < n; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {0};

		values[0] = Int64GetDatum(jobs[i].id);
		values[1] = Int64GetDatum(jobs[i].token);
		values[2] = Int32GetDatum(jobs[i].attempt);
		values[3] = jobs[i].payload;
		values[4] = jobs[i].fair_key;
		nulls[4] = jobs[i].fair_key == (Datum) 0;
		values[5] = Int16GetDatum(jobs[i].priority);
		values[6] = TimestampTzGetDatum(jobs[i].enqueued_at);
		values[7] = TimestampTzGetDatum(jobs[i].lease_until);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

static void
check_batch(int32 batch)
{
	if (batch < 1 || batch > PGJQ_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", PGJQ_MAX_BATCH)));
}

static Datum
claim_common(FunctionCallInfo fcinfo, bool many)
{
	int			nqueues;
	char	  **names = queue_names(fcinfo, many, &nqueues);
	int32		batch = PG_ARGISNULL(1) ? 1 : PG_GETARG_INT32(1);
	int64		lease_us = pgjq_arg_interval(fcinfo, 2, "lease", 0, false, 7 * USECS_PER_DAY, -1);
	char	   *worker = pgjq_arg_text(fcinfo, 3, "worker", PGJQ_MAX_WORKER);
	int64		wait_us = pgjq_arg_interval(fcinfo, 4, "wait", 0, true, 3650 * USECS_PER_DAY, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PgjqClaimedJob *jobs;
	PgjqQueue  *queues;
	int32	   *queue_ids = palloc(sizeof(int32) * nqueues);
	uint32		examined;
	int			n = 0;
	TimestampTz deadline = 0;
	TimestampTz started = 0;
	int64		retry_in_us = 0;

	check_batch(batch);
	if (wait_us > 0)
	{
		started = GetCurrentTimestamp();
		pgjq_limits_require_shmem("claim with wait");
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
					 errmsg("claim with wait needs READ COMMITTED isolation"),
					 errdetail("Under REPEATABLE READ or SERIALIZABLE it could never see a new job.")));
		deadline = GetCurrentTimestamp() + Min(wait_us, (int64) pgjq_max_wait_ms * 1000);
	}
	pgjq_srf_materialize(fcinfo);
	jobs = palloc(sizeof(PgjqClaimedJob) * batch);
	queues = palloc(sizeof(PgjqQueue) * nqueues);

	n = claim_once(names, nqueues, batch, lease_us, worker, PGJQ_GUARD_CLAIM, queues, jobs,
				   queue_ids, &examined, &retry_in_us);
	if (n == 0 && wait_us > 0)
	{
		/* register, then try once more: a commit in between is not missed */
		pgjq_wait_register(nqueues, queue_ids, false);
		PG_TRY();
		{
			int			attempt = 0;

			for (;;)
			{
				TimestampTz now;
				uint32		woken = pgjq_wait_woken();

				elog(DEBUG1, "pgjq: attempt %d of a waiting claim", ++attempt);
				retry_in_us = 0;
				n = claim_once(names, nqueues, batch, lease_us, worker, PGJQ_GUARD_CLAIM,
							   queues, jobs, queue_ids, &examined, &retry_in_us);
				/* the wake-ups of the queues it looked at are used up */
				if (woken & examined)
					pgjq_wait_used(woken & examined);
				now = GetCurrentTimestamp();
				if (n > 0 || now >= deadline)
					break;

				/*
				 * a rate limit refills, and a held key's hold ends, without
				 * any commit: wake for the token or the end
				 */
				pgjq_wait_sleep(Min(retry_in_us > 0 ? Min(deadline, now + retry_in_us) : deadline,
									pgjq_ring_hold_next()));
			}
		}
		PG_FINALLY();
		{
			/* hands on the wake-ups of queues it did not get to */
			pgjq_wait_unregister();
		}
		PG_END_TRY();
		/* a claim over several queues counts its wait in each */
		{
			int64		waited_us = GetCurrentTimestamp() - started;

			for (int i = 0; i < nqueues; i++)
				pgjq_metrics_waited(queue_ids[i], waited_us);
		}
	}

	put_claimed(rsinfo, jobs, n);
	return (Datum) 0;
}

Datum
pgjq_claim(PG_FUNCTION_ARGS)
{
	return claim_common(fcinfo, false);
}

Datum
pgjq_claim_many(PG_FUNCTION_ARGS)
{
	return claim_common(fcinfo, true);
}

/*
 * The elements of an outcome array of complete_and_claim (ids, tokens:
 * int8 without nulls; errors: text, nulls allowed).  A NULL array is empty
 * (a worker's first cycle has nothing to report).
 */
static int
cycle_array(FunctionCallInfo fcinfo, int argno, const char *argname, Oid type,
			Datum **values, bool **nulls)
{
	ArrayType  *arr = pgjq_arg_array(fcinfo, argno, argname, type, false);
	int			n;

	*values = NULL;
	*nulls = NULL;
	if (arr == NULL)
		return 0;
	if (pgjq_array_length(arr) > PGJQ_MAX_ENQUEUE_MANY)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s has too many elements", argname),
				 errdetail("complete_and_claim takes at most %d outcomes per call.",
						   PGJQ_MAX_ENQUEUE_MANY)));
	if (type == INT8OID)
		deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, values, nulls, &n);
	else
		deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, values, nulls, &n);
	if (type == INT8OID)
		for (int i = 0; i < n; i++)
			if ((*nulls)[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("%s must not contain nulls", argname)));
	return n;
}

PG_FUNCTION_INFO_V1(pgjq_complete_and_claim);

/*
 * complete_and_claim(queue, ids, tokens, batch, lease, worker, errors,
 * results): a worker's whole cycle in one statement, so one transaction (and
 * one commit) per cycle.  Each (ids[i], tokens[i]) is completed (with
 * results[i] when given), or failed with errors[i] when errors is given and
 * that element is not NULL (results[i] is then not kept); then up to
 * batch jobs are claimed from queue, exactly as claim(queue, batch, lease,
 * worker) would, except that the claim may use the room under the queue's
 * limits that those outcomes free (limits.c, own_ends).  Stale pairs change
 * nothing and are not reported (complete() and fail() say which are stale);
 * a job whose cancellation was requested ends as cancelled.  No wait: a
 * waiting claim would hold the outcomes uncommitted while it sleeps.  Under
 * Citus, on the source of a move in its last phase (claims refused there),
 * the outcomes are kept and nothing is claimed, as of a paused queue.
 */
Datum
pgjq_complete_and_claim(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	int32		batch = PG_ARGISNULL(3) ? 1 : PG_GETARG_INT32(3);
	int64		lease_us = pgjq_arg_interval(fcinfo, 4, "lease", 0, false, 7 * USECS_PER_DAY, -1);
	char	   *worker = pgjq_arg_text(fcinfo, 5, "worker", PGJQ_MAX_WORKER);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *idv,
			   *tokv,
			   *errv;
	bool	   *idnulls,
			   *toknulls,
			   *errnulls;
	int			nids = cycle_array(fcinfo, 1, "ids", INT8OID, &idv, &idnulls);
	int			ntok = cycle_array(fcinfo, 2, "tokens", INT8OID, &tokv, &toknulls);
	int			nerr = cycle_array(fcinfo, 6, "errors", TEXTOID, &errv, &errnulls);
	Datum	   *resv;
	bool	   *resnulls;
	int			nres;
	PgjqClaimedJob *jobs;
	PgjqQueue	queue;
	int32		queue_id;
	uint32		examined;
	int64		retry_in_us = 0;
	int			n;

	check_batch(batch);
	if (nids != ntok)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and tokens must have the same number of elements"),
				 errdetail("ids has %d elements, tokens has %d.", nids, ntok)));
	if (!PG_ARGISNULL(6) && nerr != nids)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("errors must have as many elements as ids"),
				 errdetail("ids has %d elements, errors has %d.", nids, nerr)));
	nres = pgjq_outcome_results(fcinfo, 7, &resv, &resnulls);
	if (nres >= 0 && nres != nids)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("results must have as many elements as ids"),
				 errdetail("ids has %d elements, results has %d.", nids, nres)));
	pgjq_guard_queue(name, PGJQ_GUARD_USE);
	pgjq_guard_id_datums(idv, nids);
	pgjq_srf_materialize(fcinfo);

	if (nids > 0)
	{
		pgjq_storage_begin();
		(void) pgjq_outcome_cycle(nids, idv, tokv, PG_ARGISNULL(6) ? NULL : errv, errnulls,
								  nres >= 0 ? resv : NULL, resnulls, GetCurrentTimestamp());
		pgjq_storage_end();
	}
	jobs = palloc(sizeof(PgjqClaimedJob) * batch);
	n = claim_once(&name, 1, batch, lease_us, worker, PGJQ_GUARD_CYCLE, &queue, jobs,
				   &queue_id, &examined, &retry_in_us);
	put_claimed(rsinfo, jobs, n);
	return (Datum) 0;
}

/* Queues of $1 that are not paused and have a ready job, with their limits. */
static PgjqPlan plan_ready = {
	"SELECT q.queue_id, coalesce(q.concurrency, 0), coalesce(q.key_concurrency, 0),"
	"       coalesce(q.rate, 0), coalesce(q.burst, 0),"
	"       EXISTS (SELECT 1 FROM pgjq.job j WHERE j.queue_id = q.queue_id AND j.state = 'r')"
	"  FROM pgjq.queue q"
	" WHERE q.queue_id = ANY ($1) AND NOT q.paused",
	1, {INT4ARRAYOID}, NULL, true
};

/*
 * The first (priority, fair key) with a ready job at or after ($2, $3), one
 * descent of the ready index.  The smallest text after s is s || E'\x01'.
 */
static PgjqPlan plan_ready_key = {
	"SELECT priority, fair_key FROM pgjq.job"
	" WHERE queue_id = $1 AND state = 'r' AND (priority, fair_key) >= ($2, $3)"
	" ORDER BY queue_id, priority, fair_key LIMIT 1",
	3, {INT4OID, INT2OID, TEXTOID}, NULL, true
};

/* Keys at their limit that _await_ready passes over before it gives up. */
#define AWAIT_MAX_FULL_KEYS 1000

/*
 * When _await_ready found ready jobs held back only by a rate limit: when
 * the next token is due.  await() reads it (the same backend runs both).
 */
static int64 await_token_in_us = 0;

PG_FUNCTION_INFO_V1(pgjq_await_ids);
PG_FUNCTION_INFO_V1(pgjq_await_ready);

/* pgjq._await_ids(queues): the queues' ids, checking names and existence. */
Datum
pgjq_await_ids(PG_FUNCTION_ARGS)
{
	int			nqueues;
	char	  **names = queue_names(fcinfo, true, &nqueues);
	PgjqQueue  *queues = palloc(sizeof(PgjqQueue) * nqueues);
	Datum	   *ids = palloc(sizeof(Datum) * nqueues);

	pgjq_storage_begin();
	(void) lookup_queues(names, nqueues, queues, PGJQ_GUARD_CLAIM);
	pgjq_storage_end();
	for (int i = 0; i < nqueues; i++)
		ids[i] = Int32GetDatum(queues[i].queue_id);
	PG_RETURN_ARRAYTYPE_P(construct_array(ids, nqueues, INT4OID, 4, true, TYPALIGN_INT));
}

/*
 * Whether a ready job of the key-limited queue belongs to a key below its
 * limit.  Walks the (priority, key) pairs of ready jobs, passing over keys
 * at their limit; after AWAIT_MAX_FULL_KEYS of them it says yes (a claim
 * sorts it out).
 */
static bool
ready_key_below_limit(int32 queue_id, int32 key_concurrency)
{
	int16		prio = PG_INT16_MIN;
	char	   *from = "";

	for (int probes = 0; probes < AWAIT_MAX_FULL_KEYS; probes++)
	{
		Datum		values[3];
		bool		isnull;
		char	   *key;

		values[0] = Int32GetDatum(queue_id);
		values[1] = Int16GetDatum(prio);
		values[2] = CStringGetTextDatum(from);
		pgjq_spi_run(&plan_ready_key, values, NULL, 1);
		if (SPI_processed == 0)
			return false;
		prio = DatumGetInt16(pgjq_spi_get(0, 1, &isnull));
		key = TextDatumGetCString(pgjq_spi_get(0, 2, &isnull));
		if (!pgjq_limits_key_full(queue_id, key, key_concurrency))
			return true;
		from = psprintf("%s\x01", key);
	}
	return true;
}

/*
 * pgjq._await_ready(ids): whether one of the queues has a ready job that a
 * claim could take now: not paused, not at its concurrency limit, of a key
 * below its key_concurrency (a completion there wakes waiters anyway), and
 * a token in its rate bucket.  When only rate limits hold ready jobs back,
 * await_token_in_us says when the first token is due.
 */
Datum
pgjq_await_ready(PG_FUNCTION_ARGS)
{
	Datum		values[1];
	bool		ready = false;
	int			nrows;
	PgjqQueue  *rows;

	pgjq_arg_not_null(fcinfo, 0, "queue_ids");
	await_token_in_us = 0;
	values[0] = PG_GETARG_DATUM(0);
	pgjq_storage_begin();
	pgjq_spi_run(&plan_ready, values, NULL, 0);
	nrows = (int) SPI_processed;
	rows = palloc0(sizeof(PgjqQueue) * Max(nrows, 1));
	for (int r = 0; r < nrows; r++)
	{
		bool		isnull;

		rows[r].queue_id = DatumGetInt32(pgjq_spi_get(r, 1, &isnull));
		rows[r].concurrency = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));
		rows[r].key_concurrency = DatumGetInt32(pgjq_spi_get(r, 3, &isnull));
		rows[r].rate = DatumGetFloat8(pgjq_spi_get(r, 4, &isnull));
		rows[r].burst = DatumGetInt32(pgjq_spi_get(r, 5, &isnull));
		/* ready in pgjq.job, or in the ring (ring.h): else not a candidate */
		if (!DatumGetBool(pgjq_spi_get(r, 6, &isnull)))
		{
			int64		ring_ready,
						ring_running;
			TimestampTz oldest;

			pgjq_ring_counts(rows[r].queue_id, false, &ring_ready, &ring_running, &oldest);
			if (ring_ready == 0)
				rows[r].queue_id = 0;
		}
	}
	for (int r = 0; r < nrows && !ready; r++)
	{
		PgjqQueue  *q = &rows[r];
		int64		token_in_us;

		if (q->queue_id == 0)
			continue;			/* nothing ready */
		if (pgjq_limits_queue_full(q->queue_id, q->concurrency))
			continue;
		/* a ring lane is parked while its key is full (ring.h) */
		if (q->key_concurrency > 0 && !pgjq_ring_claimable(q->queue_id) &&
			!ready_key_below_limit(q->queue_id, q->key_concurrency))
			continue;
		/* no commit refills a bucket: await() sleeps until the token is due */
		token_in_us = pgjq_limits_next_token_us(q);
		if (token_in_us > 0)
		{
			if (await_token_in_us == 0 || token_in_us < await_token_in_us)
				await_token_in_us = token_in_us;
			continue;
		}
		ready = true;
	}
	pgjq_storage_end();
	if (ready)
		await_token_in_us = 0;
	PG_RETURN_BOOL(ready);
}

/* SQL of await(): schema-qualified calls, safe under any search_path. */
static PgjqPlan plan_await_ids = {
	"SELECT pgjq._await_ids($1)", 1, {TEXTARRAYOID}
};
static PgjqPlan plan_await_ready = {
	"SELECT pgjq._await_ready($1)", 1, {INT4ARRAYOID}
};

/*
 * CALL pgjq.await(queues, wait): return once one of the queues has a job a
 * claim could take (see _await_ready), or the wait ends.  It sleeps until a
 * commit wakes it or, when only a rate limit holds ready jobs back, until
 * the next token is due.  Called outside a transaction block
 * (a non-atomic CALL), it commits after each check and sleeps with no
 * transaction work and no snapshot, so it never holds back the xmin horizon;
 * inside one it sleeps like claim(..., wait).  It is SECURITY INVOKER (see
 * sql/pgjq.sql); the definer helpers above do the table work.
 */
Datum
pgjq_await(PG_FUNCTION_ARGS)
{
	ArrayType  *queues = pgjq_arg_array(fcinfo, 0, "queues", TEXTOID, true);
	int64		wait_us = pgjq_arg_interval(fcinfo, 1, "wait", 0, true, 3650 * USECS_PER_DAY, -1);
	bool		atomic = !(fcinfo->context && IsA(fcinfo->context, CallContext) &&
						   !castNode(CallContext, fcinfo->context)->atomic);
	TimestampTz deadline;
	ArrayType  *ids;
	int			nids;
	int32	   *idv;
	Datum		values[1];
	bool		isnull;

	pgjq_arg_not_null(fcinfo, 1, "wait");
	pgjq_limits_require_shmem("await");
	deadline = GetCurrentTimestamp() + Min(wait_us, (int64) pgjq_max_wait_ms * 1000);

	if (SPI_connect_ext(atomic ? 0 : SPI_OPT_NONATOMIC) != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	values[0] = PointerGetDatum(queues);
	pgjq_spi_run(&plan_await_ids, values, NULL, 1);
	ids = DatumGetArrayTypePCopy(pgjq_spi_get(0, 1, &isnull));
	nids = pgjq_array_length(ids);
	idv = (int32 *) ARR_DATA_PTR(ids);

	pgjq_wait_register(nids, idv, true);
	PG_TRY();
	{
		int			check = 0;

		for (;;)
		{
			TimestampTz now;
			uint32		woken = pgjq_wait_woken();
			int64		token_in_us;

			elog(DEBUG1, "pgjq: check %d of await", ++check);
			values[0] = PointerGetDatum(ids);
			pgjq_spi_run(&plan_await_ready, values, NULL, 1);
			token_in_us = await_token_in_us;
			if (DatumGetBool(pgjq_spi_get(0, 1, &isnull)))
			{
				/* the caller claims next: hand a wake-up on to claims only */
				pgjq_wait_leaving_ready();
				break;
			}
			/* the check looked at every queue: its wake-ups are used up */
			if (woken)
				pgjq_wait_used(woken);
			now = GetCurrentTimestamp();
			if (now >= deadline)
				break;
			/* sleep outside any transaction's work, with no snapshot */
			if (!atomic)
			{
				SPI_commit();
			}
			InvalidateCatalogSnapshot();
			pgjq_wait_sleep(Min(token_in_us > 0 ? Min(deadline, now + token_in_us) : deadline,
								pgjq_ring_hold_next()));
		}
	}
	PG_FINALLY();
	{
		pgjq_wait_unregister();
	}
	PG_END_TRY();
	SPI_finish();
	PG_RETURN_VOID();
}
