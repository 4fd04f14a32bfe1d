/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  promote(), rescue(), prune() and maintain(): SQL-callable, and the
 *	  steps the background worker schedules (bgworker.c only decides when).
 *
 * Each pgjq_maintenance_* function runs inside the caller's transaction and
 * connects to SPI itself.
 *
 *-------------------------------------------------------------------------
 */
#include "args.h"
#include "storage.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_promote);
PG_FUNCTION_INFO_V1(pgjq_rescue);
PG_FUNCTION_INFO_V1(pgjq_prune);
PG_FUNCTION_INFO_V1(pgjq_maintain);

#define RESCUE_CHUNK 1000

/* Maintenance writes: refuse clearly on a hot standby. */
static void
check_not_in_recovery(void)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("pgjq maintenance cannot run during recovery"),
				 errhint("The background worker of the primary runs it.")));
}

int64
pgjq_maintenance_promote(void)
{
	int64		n;

	pgjq_storage_begin();
	n = pgjq_storage_promote(GetCurrentTimestamp());
	pgjq_storage_end();
	return n;
}

/*
 * Every running job whose lease has expired counts as a failed attempt with
 * error "lease expired": retried after the queue's backoff, dead when its
 * attempts are spent, cancelled if that was requested.
 */
int64
pgjq_maintenance_rescue(void)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		total = 0;
	int			n;

	pgjq_storage_begin();
	do
	{
		PgjqRunningJob *jobs;

		CHECK_FOR_INTERRUPTS();
		n = pgjq_storage_expired(now, RESCUE_CHUNK, &jobs);
		for (int i = 0; i < n; i++)
			(void) pgjq_outcome_failed(&jobs[i], "lease expired", -1, now);
		total += n;
		pfree(jobs);
	} while (n == RESCUE_CHUNK);
	pgjq_storage_end();
	return total;
}

int64
pgjq_maintenance_prune(void)
{
	int64		n;

	pgjq_storage_begin();
	n = pgjq_history_prune(GetCurrentTimestamp());
	pgjq_storage_end();
	return n;
}

/* When the worker must look again: the next due job or lease expiry. */
TimestampTz
pgjq_maintenance_next_deadline(void)
{
	TimestampTz t;

	pgjq_storage_begin();
	t = pgjq_storage_next_deadline();
	pgjq_storage_end();
	return t;
}

Datum
pgjq_promote(PG_FUNCTION_ARGS)
{
	check_not_in_recovery();
	PG_RETURN_INT64(pgjq_maintenance_promote());
}

Datum
pgjq_rescue(PG_FUNCTION_ARGS)
{
	check_not_in_recovery();
	PG_RETURN_INT64(pgjq_maintenance_rescue());
}

Datum
pgjq_prune(PG_FUNCTION_ARGS)
{
	check_not_in_recovery();
	PG_RETURN_INT64(pgjq_maintenance_prune());
}

Datum
pgjq_maintain(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {0};

	check_not_in_recovery();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgjq: maintain() must return a record");
	tupdesc = BlessTupleDesc(tupdesc);
	/* rescue first: a rescued job that is due at once is then promoted too */
	values[1] = Int64GetDatum(pgjq_maintenance_rescue());
	values[0] = Int64GetDatum(pgjq_maintenance_promote());
	values[2] = Int64GetDatum(pgjq_maintenance_prune());
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
