/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  SQL API: claim(queue | queues[], batch, lease, worker, wait) and the
 *	  procedure await(queues[], wait).
 *
 * Leases up to `batch` ready jobs in fair order (storage_claim.c), from the
 * queues in the order given, within each queue's limits (limits.c), and
 * returns them as pgjq.claimed rows.  Every claim call that leases a job
 * draws one new fencing token from a sequence (never reused, not even after
 * a rollback); all jobs of the call carry it.  Each queue's jobs get that
 * queue's lease (or the lease argument).  Paused queues give nothing.
 *
 * With `wait`, a call that finds nothing sleeps until a producer's commit
 * makes a job of one of its queues claimable, or the wait (capped by
 * pgjq.max_wait) ends; query cancel and statement_timeout interrupt it
 * (wait.c).  A waiting call holds its statement's snapshot, and so the xmin
 * horizon; await() waits without one.
 *
 *-------------------------------------------------------------------------
 */
#include "args.h"
#include "limits.h"
#include "spi_plans.h"

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

static void
lookup_queues(char **names, int n, PgjqQueue *queues)
{
	for (int i = 0; i < n; i++)
		pgjq_storage_queue_get_or_error(names[i], &queues[i]);
}

/*
 * One claim attempt over all queues, in order, in its own SPI session.
 * Returns how many jobs it leased into jobs[].
 */
static int
claim_once(char **names, int nqueues, int batch, int64 lease_us, const char *worker,
		   PgjqClaimedJob *jobs, int32 *queue_ids, int64 *retry_in_us)
{
	PgjqQueue  *queues = palloc(sizeof(PgjqQueue) * nqueues);
	int			n = 0;
	int64		token = 0;

	pgjq_storage_begin();
	lookup_queues(names, nqueues, queues);
	for (int i = 0; i < nqueues; i++)
	{
		PgjqQueue  *q = &queues[i];
		PgjqClaimQuota quota;
		int			want = batch - n;
		int			granted;
		int			got;
		int64		token_in_us;
		TimestampTz lease_until;

		queue_ids[i] = q->queue_id;
		if (q->paused || want <= 0)
			continue;
		granted = pgjq_limits_reserve_queue(q, want, &token_in_us);
		if (token_in_us > 0 && (*retry_in_us == 0 || token_in_us < *retry_in_us))
			*retry_in_us = token_in_us;
		if (granted == 0)
		{
			pgjq_limits_note_held_back(q->queue_id);
			continue;
		}
		pgjq_limits_init_quota(&quota, q);
		lease_until = GetCurrentTimestamp() + (lease_us > 0 ? lease_us : q->lease_us);
		got = pgjq_storage_claim(q, granted, lease_until, worker, &quota, &token, jobs + n);
		for (int k = n; k < n + got; k++)
			jobs[k].lease_until = lease_until;
		/* the worker rescues the lease on time if it ends before its wake-up */
		if (got > 0)
			pgjq_shmem_note_due(lease_until);
		pgjq_limits_settle_queue(q, granted, got);
		/* held back: a limit, not the supply of ready jobs, stopped the claim */
		if ((got == granted && granted < want) || pgjq_limits_quota_cut_short(&quota))
			pgjq_limits_note_held_back(q->queue_id);
		n += got;
	}
	pgjq_storage_end();
	return n;
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
	int32	   *queue_ids = palloc(sizeof(int32) * nqueues);
	int			n = 0;
	TimestampTz deadline = 0;
	int64		retry_in_us = 0;

	if (batch < 1 || batch > PGJQ_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", PGJQ_MAX_BATCH)));
	if (wait_us > 0)
	{
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

	n = claim_once(names, nqueues, batch, lease_us, worker, jobs, queue_ids, &retry_in_us);
	if (n == 0 && wait_us > 0)
	{
		/* register, then try once more: a commit in between is not missed */
		pgjq_wait_register(nqueues, queue_ids);
		PG_TRY();
		{
			for (;;)
			{
				TimestampTz now;

				retry_in_us = 0;
				n = claim_once(names, nqueues, batch, lease_us, worker, jobs, queue_ids,
							   &retry_in_us);
				now = GetCurrentTimestamp();
				if (n > 0 || now >= deadline)
					break;
				/* a rate limit refills without any commit: wake for its token */
				pgjq_wait_sleep(retry_in_us > 0 ? Min(deadline, now + retry_in_us) : deadline);
			}
		}
		PG_FINALLY();
		{
			pgjq_wait_unregister();
		}
		PG_END_TRY();
	}

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

/* Queues of $1 that are not paused and have a ready job, with their limit. */
static PgjqPlan plan_ready = {
	"SELECT q.queue_id, coalesce(q.concurrency, 0) FROM pgjq.queue q"
	" WHERE q.queue_id = ANY ($1) AND NOT q.paused"
	"   AND EXISTS (SELECT 1 FROM pgjq.job j WHERE j.queue_id = q.queue_id AND j.state = 'r')",
	1, {INT4ARRAYOID}
};

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
	lookup_queues(names, nqueues, queues);
	pgjq_storage_end();
	for (int i = 0; i < nqueues; i++)
		ids[i] = Int32GetDatum(queues[i].queue_id);
	PG_RETURN_ARRAYTYPE_P(construct_array(ids, nqueues, INT4OID, 4, true, TYPALIGN_INT));
}

/*
 * pgjq._await_ready(ids): whether one of the queues has a ready job that a
 * claim could take: not paused, not at its concurrency limit (a completion
 * there wakes waiters anyway); a rate limit is not considered.
 */
Datum
pgjq_await_ready(PG_FUNCTION_ARGS)
{
	Datum		values[1];
	bool		ready = false;

	pgjq_arg_not_null(fcinfo, 0, "queue_ids");
	values[0] = PG_GETARG_DATUM(0);
	pgjq_storage_begin();
	pgjq_spi_run(&plan_ready, values, NULL, 0);
	for (uint64 r = 0; r < SPI_processed && !ready; r++)
	{
		bool		isnull;

		ready = !pgjq_limits_queue_full(DatumGetInt32(pgjq_spi_get(r, 1, &isnull)),
										DatumGetInt32(pgjq_spi_get(r, 2, &isnull)));
	}
	pgjq_storage_end();
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
 * claim could take, or the wait ends.  Called outside a transaction block
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

	pgjq_wait_register(nids, idv);
	PG_TRY();
	{
		for (;;)
		{
			TimestampTz now;

			values[0] = PointerGetDatum(ids);
			pgjq_spi_run(&plan_await_ready, values, NULL, 1);
			if (DatumGetBool(pgjq_spi_get(0, 1, &isnull)))
				break;
			now = GetCurrentTimestamp();
			if (now >= deadline)
				break;
			/* sleep outside any transaction's work, with no snapshot */
			if (!atomic)
			{
				SPI_commit();
#if PG_VERSION_NUM < 140000
				SPI_start_transaction();
#endif
			}
			InvalidateCatalogSnapshot();
			pgjq_wait_sleep(deadline);
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
