/*-------------------------------------------------------------------------
 *
 * wait_jobs.c
 *	  pgjq.wait_jobs(ids, wait, all): wait until the listed jobs (all of
 *	  them, or the first one) have finished, then report each job's id,
 *	  state, attempt and result.
 *
 * Request/response over a queue in two statements: enqueue, then wait.  The
 * caller registers its jobs with wait.c before it first looks at them, so a
 * commit that finishes one after that look sets its latch (wait.c wakes
 * wait_jobs() callers once the finishing commit is visible): no polling.
 * Each look is one query over pgjq.job() with a fresh snapshot (READ
 * COMMITTED; REPEATABLE READ could never see a job finish, and a wait there
 * is refused).  The wait is capped by pgjq.max_wait and interrupted by query
 * cancel and statement_timeout.
 *
 * A job is finished when job(id) says completed, dead or cancelled, or when
 * job(id) has no row for it (it never existed, its enqueue has not
 * committed, or its history was pruned): state is NULL then.  While a job
 * is kept in the history its result is reported.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "common/args.h"
#include "state/limits.h"
#include "common/spi_plans.h"
#include "engine/engine.h"
#include "common/guc.h"
#include "state/wait.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(pgjq_wait_jobs);

#define WAIT_JOBS_MAX	10000

/* one row per listed id, in the order given */
static PgjqPlan plan_states = {
	"SELECT u.id, j.state, j.attempt, j.result"
	"  FROM pg_catalog.unnest($1) WITH ORDINALITY AS u(id, n)"
	"  LEFT JOIN LATERAL pgjq.job(u.id) AS j ON true"
	" ORDER BY u.n",
	1, {INT8ARRAYOID}, NULL, true
};

static bool
finished_state(const char *state)
{
	return state == NULL || strcmp(state, "completed") == 0 || strcmp(state, "dead") == 0 ||
		strcmp(state, "cancelled") == 0;
}

/* Look at the jobs once; how many have finished.  Rows stay in SPI_tuptable. */
static int
look(ArrayType *ids)
{
	Datum		values[1] = {PointerGetDatum(ids)};
	int			done = 0;

	pgjq_spi_run(&plan_states, values, NULL, 0);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		char	   *state = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2);

		if (finished_state(state))
			done++;
	}
	return done;
}

Datum
pgjq_wait_jobs(PG_FUNCTION_ARGS)
{
	ArrayType  *ids = pgjq_arg_array(fcinfo, 0, "ids", INT8OID, true);
	int64		wait_us;
	bool		all = PG_ARGISNULL(2) ? true : PG_GETARG_BOOL(2);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			n = pgjq_array_length(ids);
	int64	   *idv;
	TimestampTz deadline;

	pgjq_arg_not_null(fcinfo, 1, "wait");
	wait_us = pgjq_arg_interval(fcinfo, 1, "wait", 0, true, 3650 * USECS_PER_DAY, 0);
	if (array_contains_nulls(ids))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	if (n > WAIT_JOBS_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("ids has too many elements"),
				 errdetail("wait_jobs takes at most %d jobs per call.", WAIT_JOBS_MAX)));
	if (wait_us > 0)
	{
		pgjq_limits_require_shmem("wait_jobs with a wait");
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
					 errmsg("wait_jobs with a wait needs READ COMMITTED isolation"),
					 errdetail("Under REPEATABLE READ or SERIALIZABLE it could never see a job finish.")));
	}
	pgjq_srf_materialize(fcinfo);
	if (n == 0)
		return (Datum) 0;
	idv = (int64 *) ARR_DATA_PTR(ids);
	pgjq_guard_ids(idv, n);
	deadline = GetCurrentTimestamp() + Min(wait_us, (int64) pgjq_max_wait_ms * 1000);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (wait_us > 0)
		pgjq_wait_jobs_register(n, idv);
	PG_TRY();
	{
		for (;;)
		{
			int			done = look(ids);

			if (all ? done == n : done > 0)
				break;
			if (GetCurrentTimestamp() >= deadline)
				break;
			pgjq_wait_jobs_sleep(deadline);
		}
	}
	PG_FINALLY();
	{
		pgjq_wait_jobs_unregister();
	}
	PG_END_TRY();

	/* the last look's rows: tuplestore_putvalues copies them */
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		values[4];
		bool		nulls[4];

		for (int c = 0; c < 4; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1,
									  &nulls[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	SPI_finish();
	return (Datum) 0;
}
