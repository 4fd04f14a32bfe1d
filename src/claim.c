/*-------------------------------------------------------------------------
 *
 * claim.c
 *	  SQL API: claim(queue, batch, lease, worker).
 *
 * Leases up to `batch` ready jobs in fair order (storage_claim.c) and
 * returns them as pgjq.claimed rows.  Every claim call draws one new fencing
 * token from a sequence (never reused, not even after a rollback); all jobs
 * of the batch carry it.  A paused queue returns nothing.
 *
 *-------------------------------------------------------------------------
 */
#include "args.h"
#include "storage.h"

#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_claim);

Datum
pgjq_claim(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	int32		batch = PG_ARGISNULL(1) ? 1 : PG_GETARG_INT32(1);
	int64		lease_us = pgjq_arg_interval(fcinfo, 2, "lease", 0, false, 7 * USECS_PER_DAY, -1);
	char	   *worker = pgjq_arg_text(fcinfo, 3, "worker", PGJQ_MAX_WORKER);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PgjqQueue	queue;
	PgjqClaimedJob *jobs = NULL;
	int			n = 0;
	int64		token = 0;
	TimestampTz lease_until = 0;

	if (batch < 1 || batch > PGJQ_MAX_BATCH)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and %d", PGJQ_MAX_BATCH)));
	pgjq_srf_materialize(fcinfo);

	pgjq_storage_begin();
	if (!pgjq_storage_queue_get(name, &queue))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", name)));
	if (!queue.paused)
	{
		lease_until = GetCurrentTimestamp() + (lease_us > 0 ? lease_us : queue.lease_us);
		n = pgjq_storage_claim(&queue, batch, lease_until, worker, &token, &jobs);
	}
	pgjq_storage_end();

	for (int i = 0; i < n; i++)
	{
		Datum		values[8];
		bool		nulls[8] = {0};

		values[0] = Int64GetDatum(jobs[i].id);
		values[1] = Int64GetDatum(token);
		values[2] = Int32GetDatum(jobs[i].attempt);
		values[3] = jobs[i].payload;
		values[4] = jobs[i].fair_key;
		nulls[4] = jobs[i].fair_key == (Datum) 0;
		values[5] = Int16GetDatum(jobs[i].priority);
		values[6] = TimestampTzGetDatum(jobs[i].enqueued_at);
		values[7] = TimestampTzGetDatum(lease_until);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
