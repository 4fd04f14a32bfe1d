/*-------------------------------------------------------------------------
 *
 * enqueue.c
 *	  SQL API: enqueue() and enqueue_many().
 *
 * Both validate everything first, then take a shared lock on the queue name
 * (so a concurrent drop_queue cannot leave orphans), then insert in one
 * statement.  A job due in the future starts 'scheduled'; its due time is
 * handed to the background worker at commit (shmem.c) so it is promoted on
 * time without polling.
 *
 * A call whose jobs are due now appends them to the ring (ring.h; a job
 * with a dedup_key also inserts its anchor into pgjq.job); delayed jobs wait
 * in pgjq.job until promotion appends them.
 *
 *-------------------------------------------------------------------------
 */
#include "metrics.h"
#include "args.h"
#include "dedup.h"
#include "ring.h"
#include "storage.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_enqueue);
PG_FUNCTION_INFO_V1(pgjq_enqueue_many);

#define MAX_DELAY_US (10 * USECS_PER_YEAR)

/*
 * When the job is due, from delay (arg 2) and run_at (arg 3): at most one of
 * them, at most ten years ahead.
 */
static TimestampTz
due_time(FunctionCallInfo fcinfo, TimestampTz now)
{
	if (!PG_ARGISNULL(2) && !PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("delay and run_at cannot both be given")));
	if (!PG_ARGISNULL(3))
	{
		TimestampTz run_at = PG_GETARG_TIMESTAMPTZ(3);

		if (TIMESTAMP_NOT_FINITE(run_at) || run_at > now + MAX_DELAY_US)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("run_at is out of range"),
					 errdetail("run_at must be finite and at most 3650 days ahead.")));
		return run_at;
	}
	return now + pgjq_arg_interval(fcinfo, 2, "delay", 0, true, MAX_DELAY_US, 0);
}

/*
 * The priority argument.  Declared integer so that plain literals and the
 * int4/int8 parameters drivers bind resolve; stored as smallint.
 */
static int16
priority_arg(FunctionCallInfo fcinfo)
{
	int32		p;

	if (PG_ARGISNULL(4))
		return 0;
	p = PG_GETARG_INT32(4);
	if (p < PG_INT16_MIN || p > PG_INT16_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("priority must be between %d and %d", PG_INT16_MIN, PG_INT16_MAX)));
	return (int16) p;
}

/*
 * The jobs into the ring; delayed ones wait in pgjq.job until promotion
 * appends them, and so do immediate ones when the ring's positions are
 * (nearly) all taken: claims move them into the ring when there is room.
 */
static void
store_jobs(const PgjqQueue *queue, PgjqNewJobs *jobs)
{
	if (jobs->run_at <= jobs->enqueued_at && pgjq_ring_has_room(jobs->n))
		pgjq_ring_enqueue(queue->queue_id, jobs->max_attempts, jobs);
	else
		pgjq_storage_enqueue(queue->queue_id, jobs);
}

static void
queue_for_enqueue(const char *name, PgjqQueue *queue)
{
	pgjq_storage_queue_lock(name, RowExclusiveLock);
	pgjq_storage_queue_get_or_error(name, queue);
}

Datum
pgjq_enqueue(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	TimestampTz now = GetCurrentStatementStartTimestamp();
	PgjqNewJobs jobs = {0};
	Datum		payload;
	Datum		fair_key = (Datum) 0;
	Datum		dedup_key = (Datum) 0;
	bool		fair_null = PG_ARGISNULL(5);
	bool		dedup_null = PG_ARGISNULL(6);
	int64		id;
	PgjqQueue	queue;
	PgjqDedup	dedup;

	pgjq_arg_not_null(fcinfo, 1, "payload");
	payload = PG_GETARG_DATUM(1);
	pgjq_check_payload(payload, "payload");
	jobs.run_at = due_time(fcinfo, now);
	jobs.priority = priority_arg(fcinfo);
	if (!fair_null)
	{
		fair_key = PG_GETARG_DATUM(5);
		pgjq_check_key(DatumGetTextPP(fair_key), "fair_key", PGJQ_MAX_KEY);
	}
	if (!dedup_null)
	{
		dedup_key = PG_GETARG_DATUM(6);
		pgjq_check_key(DatumGetTextPP(dedup_key), "dedup_key", PGJQ_MAX_KEY);
	}
	if (!PG_ARGISNULL(7) && (PG_GETARG_INT32(7) < 1 || PG_GETARG_INT32(7) > 10000))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_attempts must be between 1 and %d", 10000)));
	jobs.timeout_us = pgjq_arg_interval(fcinfo, 8, "timeout", 0, false, 365 * USECS_PER_DAY, 0);
	pgjq_dedup_args(fcinfo, 9, !dedup_null, "a dedup_key", &dedup);

	jobs.n = 1;
	jobs.ids = &id;
	jobs.payloads = &payload;
	jobs.fair_keys = &fair_key;
	jobs.fair_key_nulls = &fair_null;
	jobs.dedup_keys = &dedup_key;
	jobs.dedup_key_nulls = &dedup_null;
	jobs.enqueued_at = now;

	pgjq_storage_begin();
	queue_for_enqueue(name, &queue);
	jobs.max_attempts = PG_ARGISNULL(7) ? queue.max_attempts : PG_GETARG_INT32(7);
	pgjq_dedup_store(&queue, &jobs, &dedup, store_jobs);
	pgjq_storage_end();
	pgjq_metrics_count(queue.queue_id, PGJQ_M_ENQUEUED, jobs.n);

	if (jobs.run_at > now)
		pgjq_shmem_note_due(jobs.run_at);
	PG_RETURN_INT64(id);
}

/*
 * Elements of an optional text[] argument parallel to payloads: NULL array
 * means none; otherwise it must have exactly n elements.
 */
static void
parallel_keys(FunctionCallInfo fcinfo, int argno, const char *argname, int n,
			  Datum **values, bool **nulls)
{
	ArrayType  *arr = pgjq_arg_array(fcinfo, argno, argname, TEXTOID, false);
	int			count;

	*values = NULL;
	*nulls = NULL;
	if (arr == NULL)
		return;
	if (pgjq_array_length(arr) != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must have as many elements as payloads", argname),
				 errdetail("payloads has %d elements, %s has %d.", n, argname,
						   pgjq_array_length(arr))));
	if (n == 0)
		return;
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, values, nulls, &count);
	for (int i = 0; i < count; i++)
		if (!(*nulls)[i] && VARSIZE_ANY_EXHDR(DatumGetPointer((*values)[i])) > PGJQ_MAX_KEY)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s element is too long", argname),
					 errdetail("Element %d has more than %d bytes.", i + 1, PGJQ_MAX_KEY)));
}

Datum
pgjq_enqueue_many(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	TimestampTz now = GetCurrentStatementStartTimestamp();
	ArrayType  *payloads = pgjq_arg_array(fcinfo, 1, "payloads", JSONBOID, true);
	int			n = pgjq_array_length(payloads);
	PgjqNewJobs jobs = {0};
	bool	   *payload_nulls = NULL;
	int			count;
	PgjqQueue	queue;
	PgjqDedup	dedup;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	if (n > PGJQ_MAX_ENQUEUE_MANY)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("payloads has too many elements"),
				 errdetail("enqueue_many takes at most %d jobs per call.", PGJQ_MAX_ENQUEUE_MANY)));
	jobs.run_at = due_time(fcinfo, now);
	jobs.priority = priority_arg(fcinfo);
	parallel_keys(fcinfo, 5, "fair_keys", n, &jobs.fair_keys, &jobs.fair_key_nulls);
	parallel_keys(fcinfo, 6, "dedup_keys", n, &jobs.dedup_keys, &jobs.dedup_key_nulls);
	jobs.timeout_us = pgjq_arg_interval(fcinfo, 7, "timeout", 0, false, 365 * USECS_PER_DAY, 0);
	pgjq_dedup_args(fcinfo, 8, jobs.dedup_keys != NULL || !PG_ARGISNULL(6), "dedup_keys", &dedup);
	if (n > 0)
	{
		deconstruct_array(payloads, JSONBOID, -1, false, TYPALIGN_INT,
						  &jobs.payloads, &payload_nulls, &count);
		for (int i = 0; i < n; i++)
		{
			if (payload_nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("payloads must not contain nulls"),
						 errdetail("Element %d is null.", i + 1)));
			pgjq_check_payload(jobs.payloads[i], "payloads element");
		}
	}

	pgjq_srf_materialize(fcinfo);
	if (n == 0)
	{
		/* still check that the queue exists */
		pgjq_storage_begin();
		queue_for_enqueue(name, &queue);
		pgjq_storage_end();
		return (Datum) 0;
	}

	jobs.n = n;
	jobs.ids = palloc(sizeof(int64) * n);
	jobs.enqueued_at = now;
	pgjq_storage_begin();
	queue_for_enqueue(name, &queue);
	jobs.max_attempts = queue.max_attempts;
	pgjq_dedup_store(&queue, &jobs, &dedup, store_jobs);
	pgjq_storage_end();
	pgjq_metrics_count(queue.queue_id, PGJQ_M_ENQUEUED, jobs.n);

	for (int i = 0; i < n; i++)
	{
		Datum		v = Int64GetDatum(jobs.ids[i]);
		bool		isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &v, &isnull);
	}
	if (jobs.run_at > now)
		pgjq_shmem_note_due(jobs.run_at);
	return (Datum) 0;
}
