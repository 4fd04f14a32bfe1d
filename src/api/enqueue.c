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
#include "api/guard.h"
#include "state/metric_counters.h"
#include "common/args.h"
#include "engine/engine.h"
#include "state/worker_slots.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
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

#define MAX_DEPS_PER_CALL 100000

static void
too_many_deps(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("after names too many jobs"),
			 errdetail("A call names at most %d dependencies.", MAX_DEPS_PER_CALL)));
}

static void
no_deps_with_dedup(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("after cannot be combined with a dedup_key")));
}

/* enqueue's after (bigint[]): the jobs it waits for; false when none */
static bool
deps_of_one(FunctionCallInfo fcinfo, int argno, PgjqJobDeps *deps)
{
	ArrayType  *arr;
	Datum	   *v;
	bool	   *nulls;
	int			n;

	memset(deps, 0, sizeof(*deps));
	if (PG_NARGS() <= argno)
		return false;
	arr = pgjq_arg_array(fcinfo, argno, "after", INT8OID, false);
	if (arr == NULL || pgjq_array_length(arr) == 0)
		return false;
	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &v, &nulls, &n);
	if (n > MAX_DEPS_PER_CALL)
		too_many_deps();
	deps->ids = palloc(sizeof(int64) * n);
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("after must not contain nulls")));
		deps->ids[deps->n_ids++] = DatumGetInt64(v[i]);
	}
	return true;
}

/*
 * enqueue_many's after (jsonb[], one element per payload): element i is
 * NULL or a JSON array of job ids (numbers) and of "#k", the k-th job of this
 * call (k from 1, before job i).  Returns false when no job has any.
 */
static bool
deps_of_many(FunctionCallInfo fcinfo, int argno, int n, PgjqJobDeps **out)
{
	ArrayType  *arr;
	Datum	   *v;
	bool	   *nulls;
	int			count;
	PgjqJobDeps *deps;
	bool		any = false;
	int			total = 0;

	*out = NULL;
	if (PG_NARGS() <= argno)
		return false;
	arr = pgjq_arg_array(fcinfo, argno, "after", JSONBOID, false);
	if (arr == NULL)
		return false;
	if (pgjq_array_length(arr) != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("after must have as many elements as payloads"),
				 errdetail("payloads has %d elements, after has %d.", n, pgjq_array_length(arr))));
	if (n == 0)
		return false;
	deconstruct_array(arr, JSONBOID, -1, false, TYPALIGN_INT, &v, &nulls, &count);
	deps = palloc0(sizeof(PgjqJobDeps) * n);
	for (int i = 0; i < n; i++)
	{
		Jsonb	   *j;
		JsonbIterator *it;
		JsonbValue	jv;
		JsonbIteratorToken tok;
		int			len;

		if (nulls[i])
			continue;
		j = DatumGetJsonbP(v[i]);
		if (!JB_ROOT_IS_ARRAY(j) || JB_ROOT_IS_SCALAR(j))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("after element %d must be a JSON array", i + 1),
					 errhint("Name job ids as numbers and jobs of the same call as \"#k\" (k from 1), e.g. '[42, \"#1\"]'.")));
		len = JB_ROOT_COUNT(j);
		total += len;
		if (total > MAX_DEPS_PER_CALL)
			too_many_deps();
		deps[i].ids = palloc(sizeof(int64) * Max(len, 1));
		deps[i].positions = palloc(sizeof(int) * Max(len, 1));
		it = JsonbIteratorInit(&j->root);
		while ((tok = JsonbIteratorNext(&it, &jv, true)) != WJB_DONE)
		{
			if (tok != WJB_ELEM)
				continue;
			if (jv.type == jbvNumeric)
			{
				char	   *num = DatumGetCString(DirectFunctionCall1(numeric_out,
																	  NumericGetDatum(jv.val.numeric)));
				char	   *end;
				int64		id;

				errno = 0;
				id = strtoll(num, &end, 10);
				if (*end != '\0' || errno != 0 || id <= 0)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("after element %d names an invalid job id %s", i + 1, num),
							 errdetail("Job ids are positive integers.")));
				deps[i].ids[deps[i].n_ids++] = id;
			}
			else if (jv.type == jbvString && jv.val.string.len > 1 && jv.val.string.val[0] == '#')
			{
				char	   *str = pnstrdup(jv.val.string.val + 1, jv.val.string.len - 1);
				char	   *end;
				long		k = strtol(str, &end, 10);

				if (*end != '\0' || k < 1 || k > n)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("after element %d names an invalid position \"#%s\"", i + 1, str),
							 errdetail("A position is \"#k\" with k from 1 to the number of payloads.")));
				if (k > i)
					ereport(ERROR,
							(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
							 errmsg("after element %d names position #%ld, which does not come before it", i + 1, k),
							 errdetail("A job can depend only on jobs that exist or come earlier in the same call, so no cycle can be expressed.")));
				deps[i].positions[deps[i].n_positions++] = (int) k - 1;
			}
			else
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("after element %d must contain job ids and \"#k\" positions only", i + 1)));
		}
		any = any || deps[i].n_ids + deps[i].n_positions > 0;
	}
	*out = deps;
	return any;
}

static void
queue_for_enqueue(const char *name, PgjqQueue *queue)
{
	pgjq_storage_queue_lock(name, RowExclusiveLock);
	/* after the lock: a move's fence waits for it and is seen after it */
	pgjq_guard_queue(name, PGJQ_GUARD_ADD);
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
	PgjqJobDeps deps;
	bool		has_deps;
	char		on_failure;

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
	has_deps = deps_of_one(fcinfo, 13, &deps);
	on_failure = pgjq_deps_failure_arg(fcinfo, 14);
	if (has_deps && !dedup_null)
		no_deps_with_dedup();

	pgjq_storage_begin();
	queue_for_enqueue(name, &queue);
	jobs.max_attempts = PG_ARGISNULL(7) ? queue.max_attempts : PG_GETARG_INT32(7);
	if (has_deps)
		pgjq_deps_enqueue(&queue, &jobs, &deps, on_failure, store_jobs);
	else
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
	PgjqJobDeps *deps = NULL;
	bool		has_deps;
	char		on_failure;
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

	has_deps = deps_of_many(fcinfo, 12, n, &deps);
	on_failure = pgjq_deps_failure_arg(fcinfo, 13);
	if (has_deps && (jobs.dedup_keys != NULL || !PG_ARGISNULL(6)))
		no_deps_with_dedup();

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
	if (has_deps)
		pgjq_deps_enqueue(&queue, &jobs, deps, on_failure, store_jobs);
	else
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
