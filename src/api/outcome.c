/*-------------------------------------------------------------------------
 *
 * outcome.c
 *	  SQL API for a claimed job's outcome: complete, fail, heartbeat,
 *	  snooze; and cancel and retry_dead.
 *
 * Every outcome names (id, token).  A pair that does not match a running job
 * (the lease was rescued, the job finished, or the token is from an older
 * claim) is stale: the call changes nothing and answers false / 'stale' /
 * NULL rather than raising an error.  A running job whose cancellation was
 * requested ends as cancelled on its next outcome call, which answers as if
 * stale, telling the worker to stop.  pgjq_outcome_cycle() applies the
 * outcomes of complete_and_claim (claim.c) the same way.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "api/outcome.h"
#include "common/args.h"
#include "state/metric_counters.h"
#include "engine/engine.h"
#include "state/worker_slots.h"

#include "catalog/pg_type.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_complete);
PG_FUNCTION_INFO_V1(pgjq_complete_many);
PG_FUNCTION_INFO_V1(pgjq_fail);
PG_FUNCTION_INFO_V1(pgjq_heartbeat);
PG_FUNCTION_INFO_V1(pgjq_snooze);
PG_FUNCTION_INFO_V1(pgjq_cancel);
PG_FUNCTION_INFO_V1(pgjq_cancel_many);
PG_FUNCTION_INFO_V1(pgjq_cancel_key);
PG_FUNCTION_INFO_V1(pgjq_retry_dead);

#define MAX_DELAY_US (10 * USECS_PER_YEAR)

/*
 * Fail (id, token) in the ring; a retry's run_at is noted for the worker,
 * which promotes it on time (it may plan to sleep past it).  Returns the
 * outcome: 's' a retry, a final state, or 0 when stale.
 */
static char
fail_job(int64 id, int64 token, const char *error, int64 retry_in_us, TimestampTz now,
		 bool rescue)
{
	TimestampTz run_at = 0;
	char		r;

	/* a ring job in flight: its claim closed, the job written where it goes */
	switch (pgjq_ring_fail(id, token, error, retry_in_us, 0, rescue ? now : 0, now,
						   &r, &run_at))
	{
		case PGJQ_RING_FAILED:
			break;
		default:
			/* stale, or not a job in flight (a rescued lease that ended) */
			return 0;
	}
	if (r == 's')
		pgjq_shmem_note_due(run_at);
	return r;
}

char
pgjq_outcome_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
				  TimestampTz now)
{
	return fail_job(id, token, error, retry_in_us, now, false);
}

/*
 * Rescue of a ring claim whose lease was seen ending before now: a failed
 * attempt with error "lease expired" (or "timed out" when its claim's
 * deadline has passed), unless a heartbeat extended the lease meanwhile or
 * the claim ended (then 0, nothing changes).
 */
char
pgjq_outcome_rescue_ring(int64 id, int64 token, TimestampTz now)
{
	TimestampTz deadline = pgjq_ring_deadline(id, token);

	/* no lease goes past the deadline: at the deadline, the lease ends */
	if (deadline != 0 && deadline <= now)
		return fail_job(id, token, "timed out: still running at its execution deadline (timeout)",
						-1, now, true);
	return fail_job(id, token, "lease expired", -1, now, true);
}

/*
 * Complete (ids[i], tokens[i]) with results[i] (NULL pointer: no results);
 * a pair that is not in flight is stale.
 */
static int64
complete_jobs(int n, Datum *ids, Datum *tokens, const Datum *results, const bool *result_nulls,
			  TimestampTz now)
{
	return pgjq_ring_complete(n, ids, tokens, results, result_nulls, now);
}

/*
 * The elements of a results argument (jsonb[], nulls allowed: no result for
 * that job), each within pgjq.max_payload_size.  NULL array: none.
 */
int
pgjq_outcome_results(FunctionCallInfo fcinfo, int argno, Datum **values, bool **nulls)
{
	ArrayType  *arr;
	int			n;

	*values = NULL;
	*nulls = NULL;
	if (PG_NARGS() <= argno)
		return -1;
	arr = pgjq_arg_array(fcinfo, argno, "results", JSONBOID, false);
	if (arr == NULL)
		return -1;
	deconstruct_array(arr, JSONBOID, -1, false, TYPALIGN_INT, values, nulls, &n);
	for (int i = 0; i < n; i++)
		if (!(*nulls)[i])
			pgjq_check_payload((*values)[i], "results element");
	return n;
}

Datum
pgjq_complete(PG_FUNCTION_ARGS)
{
	Datum		id;
	Datum		token;
	Datum		result = (Datum) 0;
	bool		no_result = true;
	int64		n;
	TimestampTz now = GetCurrentTimestamp();

	pgjq_arg_not_null(fcinfo, 0, "id");
	pgjq_arg_not_null(fcinfo, 1, "token");
	id = PG_GETARG_DATUM(0);
	token = PG_GETARG_DATUM(1);
	if (PG_NARGS() > 2 && !PG_ARGISNULL(2))
	{
		result = PointerGetDatum(PG_DETOAST_DATUM(PG_GETARG_DATUM(2)));
		pgjq_check_payload(result, "result");
		no_result = false;
	}
	pgjq_guard_id_datums(&id, 1);
	pgjq_storage_begin();
	pgjq_metrics_call_begin();
	n = complete_jobs(1, &id, &token, no_result ? NULL : &result, &no_result, now);
	pgjq_storage_end();
	token = PG_GETARG_DATUM(1);
	pgjq_metrics_completed(1, &token, n, now);
	PG_RETURN_BOOL(n == 1);
}

static void
int8_elements(ArrayType *arr, const char *argname, Datum **values, int *n)
{
	bool	   *nulls;

	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, values, &nulls, n);
	for (int i = 0; i < *n; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", argname)));
}

Datum
pgjq_complete_many(PG_FUNCTION_ARGS)
{
	ArrayType  *ids = pgjq_arg_array(fcinfo, 0, "ids", INT8OID, true);
	ArrayType  *tokens = pgjq_arg_array(fcinfo, 1, "tokens", INT8OID, true);
	Datum	   *idv;
	Datum	   *tokv;
	Datum	   *resv;
	bool	   *resnulls;
	int			nids;
	int			ntok;
	int			nres;
	int64		n;
	TimestampTz now = GetCurrentTimestamp();

	if (pgjq_array_length(ids) != pgjq_array_length(tokens))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and tokens must have the same number of elements"),
				 errdetail("ids has %d elements, tokens has %d.",
						   pgjq_array_length(ids), pgjq_array_length(tokens))));
	if (pgjq_array_length(ids) > PGJQ_MAX_ENQUEUE_MANY)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("ids has too many elements"),
				 errdetail("complete takes at most %d jobs per call.", PGJQ_MAX_ENQUEUE_MANY)));
	nres = pgjq_outcome_results(fcinfo, 2, &resv, &resnulls);
	if (nres >= 0 && nres != pgjq_array_length(ids))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("results must have as many elements as ids"),
				 errdetail("ids has %d elements, results has %d.", pgjq_array_length(ids), nres)));
	if (pgjq_array_length(ids) == 0)
		PG_RETURN_INT64(0);
	int8_elements(ids, "ids", &idv, &nids);
	int8_elements(tokens, "tokens", &tokv, &ntok);
	pgjq_guard_id_datums(idv, nids);

	pgjq_storage_begin();
	pgjq_metrics_call_begin();
	{
		Datum	   *ids2 = palloc(sizeof(Datum) * nids);
		Datum	   *tok2 = palloc(sizeof(Datum) * nids);

		/* complete_jobs reorders its arrays; metrics needs the tokens */
		memcpy(ids2, idv, sizeof(Datum) * nids);
		memcpy(tok2, tokv, sizeof(Datum) * nids);
		n = complete_jobs(nids, ids2, tok2, nres >= 0 ? resv : NULL, resnulls, now);
	}
	pgjq_storage_end();
	pgjq_metrics_completed(nids, tokv, n, now);
	PG_RETURN_INT64(n);
}

/* An error text clipped to PGJQ_MAX_ERROR bytes on a character boundary. */
static char *
clip_error(text *t)
{
	char	   *s = text_to_cstring(t);
	int			len = strlen(s);

	if (len > PGJQ_MAX_ERROR)
		s[pg_mbcliplen(s, len, PGJQ_MAX_ERROR)] = '\0';
	return s;
}

/* The error text of fail(). */
static char *
error_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return clip_error(PG_GETARG_TEXT_PP(argno));
}

/*
 * The outcomes of a worker's cycle (complete_and_claim): each (ids[i],
 * tokens[i]) is completed, or failed with errors[i] when errors is given and
 * that element is not NULL (a retry after the queue's backoff, or dead when
 * its attempts are spent).  results (NULL pointer: none) are the completed
 * jobs' results (a failed one's is not kept).  Stale pairs change nothing.
 * The arrays were checked by the caller (same length, no nulls in ids and
 * tokens).  Returns
 * how many jobs it completed or failed.  Caller is between
 * pgjq_storage_begin() and pgjq_storage_end().
 */
int64
pgjq_outcome_cycle(int n, Datum *ids, Datum *tokens, Datum *errors, bool *error_nulls,
				   Datum *results, bool *result_nulls, TimestampTz now)
{
	Datum	   *cids = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *ctoks = palloc(sizeof(Datum) * Max(n, 1));
	Datum	   *cres = palloc(sizeof(Datum) * Max(n, 1));
	bool	   *cresn = palloc(sizeof(bool) * Max(n, 1));
	int			ncomplete = 0;
	int64		done = 0;

	for (int i = 0; i < n; i++)
	{
		char		r;

		if (errors == NULL || error_nulls[i])
		{
			cids[ncomplete] = ids[i];
			ctoks[ncomplete] = tokens[i];
			cresn[ncomplete] = results == NULL || result_nulls[i];
			cres[ncomplete] = cresn[ncomplete] ? (Datum) 0 : results[i];
			ncomplete++;
			continue;
		}
		pgjq_metrics_call_begin();
		r = pgjq_outcome_fail(DatumGetInt64(ids[i]), DatumGetInt64(tokens[i]),
							  clip_error(DatumGetTextPP(errors[i])), -1, now);
		if (r != 0)
		{
			pgjq_metrics_job_outcome(DatumGetInt64(tokens[i]),
									 r == 's' ? PGJQ_M_FAILED : PGJQ_M_NCOUNTERS, now);

			/*
			 * a cancelled job ends as cancelled, and counts as stale, as in
			 * fail()
			 */
			if (r != PGJQ_FINISHED_CANCELLED)
				done++;
		}
		else
			pgjq_metrics_stale(1, &tokens[i]);
	}
	if (ncomplete > 0)
	{
		int64		completed;

		pgjq_metrics_call_begin();
		{
			Datum	   *tok2 = palloc(sizeof(Datum) * ncomplete);

			memcpy(tok2, ctoks, sizeof(Datum) * ncomplete);
			completed = complete_jobs(ncomplete, cids, tok2, results ? cres : NULL, cresn, now);
		}
		pgjq_metrics_completed(ncomplete, ctoks, completed, now);
		done += completed;
	}
	return done;
}

Datum
pgjq_fail(PG_FUNCTION_ARGS)
{
	int64		id;
	int64		token;
	char	   *error;
	int64		retry_in_us;
	int64		hold_us;
	int32		hold_queue = 0;
	char	   *hold_key = NULL;
	TimestampTz now = GetCurrentTimestamp();
	char		r;
	const char *result = "stale";

	pgjq_arg_not_null(fcinfo, 0, "id");
	pgjq_arg_not_null(fcinfo, 1, "token");
	id = PG_GETARG_INT64(0);
	token = PG_GETARG_INT64(1);
	error = error_arg(fcinfo, 2);
	retry_in_us = pgjq_arg_interval(fcinfo, 3, "retry_in", 0, true, MAX_DELAY_US, -1);
	hold_us = pgjq_arg_interval(fcinfo, 4, "hold_key_for", 0, false, 365 * USECS_PER_DAY, 0);
	pgjq_guard_ids(&id, 1);

	pgjq_storage_begin();
	pgjq_metrics_call_begin();
	/* the job's key, read while its claim is still open (key_hold.c) */
	if (hold_us > 0 && !pgjq_ring_job_key(id, token, &hold_queue, &hold_key))
		hold_us = 0;			/* stale: nothing changes */
	r = pgjq_outcome_fail(id, token, error, retry_in_us, now);
	if (r != 0 && hold_us > 0)
		pgjq_key_hold(hold_queue, hold_key, now + hold_us);
	if (r != 0)
	{
		pgjq_metrics_job_outcome(token, r == 's' ? PGJQ_M_FAILED : PGJQ_M_NCOUNTERS, now);
		switch (r)
		{
			case 's':
				result = "retry";
				break;
			case PGJQ_FINISHED_DEAD:
				result = "dead";
				break;
			default:
				result = "stale";	/* cancelled */
				break;
		}
	}
	else
		pgjq_metrics_stale(1, &PG_GETARG_DATUM(1));
	pgjq_storage_end();
	PG_RETURN_TEXT_P(cstring_to_text(result));
}

Datum
pgjq_heartbeat(PG_FUNCTION_ARGS)
{
	int64		id;
	int64		token;
	int64		extend_us;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz lease_until;
	bool		found;

	pgjq_arg_not_null(fcinfo, 0, "id");
	pgjq_arg_not_null(fcinfo, 1, "token");
	id = PG_GETARG_INT64(0);
	token = PG_GETARG_INT64(1);
	extend_us = pgjq_arg_interval(fcinfo, 2, "extend", 0, false, 7 * USECS_PER_DAY, -1);
	pgjq_guard_ids(&id, 1);

	pgjq_storage_begin();
	pgjq_metrics_call_begin();
	/* a ring job in flight: one 'h' log row, nothing moves (ring.h) */
	switch (pgjq_ring_heartbeat(id, token, extend_us, now, &lease_until))
	{
		case PGJQ_RING_EXTENDED:
			found = true;
			break;
		case PGJQ_RING_CANCELLED:
			/* its cancellation was requested: it ended as cancelled */
			pgjq_metrics_job_outcome(token, PGJQ_M_NCOUNTERS, now);
			pgjq_storage_end();
			PG_RETURN_NULL();
		case PGJQ_RING_TIMED_OUT:
			/* its deadline has passed: rescue ends the attempt */
			pgjq_storage_end();
			PG_RETURN_NULL();
		default:
			/* stale, or not a job in flight */
			found = false;
			lease_until = 0;
			break;
	}
	if (!found)
		pgjq_metrics_stale(1, &PG_GETARG_DATUM(1));
	pgjq_storage_end();
	if (!found)
		PG_RETURN_NULL();
	/* a shorter extension can end the lease before the worker's wake-up */
	pgjq_shmem_note_due(lease_until);
	PG_RETURN_TIMESTAMPTZ(lease_until);
}

Datum
pgjq_snooze(PG_FUNCTION_ARGS)
{
	int64		id;
	int64		token;
	int64		delay_us;
	TimestampTz now = GetCurrentTimestamp();
	char		r;
	bool		snoozed;

	pgjq_arg_not_null(fcinfo, 0, "id");
	pgjq_arg_not_null(fcinfo, 1, "token");
	pgjq_arg_not_null(fcinfo, 2, "delay");
	id = PG_GETARG_INT64(0);
	token = PG_GETARG_INT64(1);
	delay_us = pgjq_arg_interval(fcinfo, 2, "delay", 0, true, MAX_DELAY_US, 0);
	pgjq_guard_ids(&id, 1);

	pgjq_storage_begin();
	pgjq_metrics_call_begin();
	{
		TimestampTz run_at;

		/* a ring job in flight: its claim closed, scheduled in pgjq.job */
		switch (pgjq_ring_fail(id, token, NULL, 0, now + delay_us, 0, now, &r, &run_at))
		{
			case PGJQ_RING_FAILED:
				break;
			default:
				/* stale, or not a job in flight */
				r = 0;
				break;
		}
	}
	snoozed = (r == 's');
	if (r != 0)
		pgjq_metrics_job_outcome(token, snoozed ? PGJQ_M_SNOOZED : PGJQ_M_NCOUNTERS, now);
	else
		pgjq_metrics_stale(1, &PG_GETARG_DATUM(1));
	pgjq_storage_end();
	if (snoozed)
		pgjq_shmem_note_due(now + delay_us);
	PG_RETURN_BOOL(snoozed);
}

/* Cancel one job; caller is between pgjq_storage_begin and _end. */
static bool
cancel_one(int64 id, TimestampTz now)
{
	PgjqCancelResult r;

	/*
	 * a ready ring job ends here; a running one gets its cancellation
	 * requested in the ring (ring.h)
	 */
	if (pgjq_ring_take_ready(id))
		r = PGJQ_CANCEL_DONE;
	else if (pgjq_ring_request_cancel(id))
		r = PGJQ_CANCEL_REQUESTED;
	/* (a claim it waited for rolled back: ready again) */
	else if (pgjq_ring_take_ready(id))
		r = PGJQ_CANCEL_DONE;
	/* a job waiting in pgjq.job (delayed, or not yet moved into the ring) */
	else
		r = pgjq_storage_cancel(id, now);
	return r != PGJQ_CANCEL_NOT_FOUND;
}

Datum
pgjq_cancel(PG_FUNCTION_ARGS)
{
	bool		found;
	int64		id;

	pgjq_arg_not_null(fcinfo, 0, "id");
	id = PG_GETARG_INT64(0);
	pgjq_guard_ids(&id, 1);
	pgjq_storage_begin();
	found = cancel_one(PG_GETARG_INT64(0), GetCurrentTimestamp());
	pgjq_storage_end();
	PG_RETURN_BOOL(found);
}

static int
int64_cmp(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/* Cancel each distinct id of ids[0..n) (sorted here); returns how many. */
static int64
cancel_ids(int64 *ids, int n)
{
	TimestampTz now = GetCurrentTimestamp();
	int64		done = 0;

	qsort(ids, n, sizeof(int64), int64_cmp);
	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (i > 0 && ids[i] == ids[i - 1])
			continue;
		if (cancel_one(ids[i], now))
			done++;
	}
	return done;
}

/*
 * cancel_many(ids bigint[]): each job as cancel(id) does, one at a time (each
 * takes the ring's lock only for its own job, so claims go on); returns how
 * many were cancelled or asked to stop.
 */
Datum
pgjq_cancel_many(PG_FUNCTION_ARGS)
{
	ArrayType  *arr = pgjq_arg_array(fcinfo, 0, "ids", INT8OID, true);
	Datum	   *idv;
	int64	   *ids;
	int			n;
	int64		done;

	if (pgjq_array_length(arr) > PGJQ_MAX_ENQUEUE_MANY)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("ids has too many elements"),
				 errdetail("cancel takes at most %d jobs per call.", PGJQ_MAX_ENQUEUE_MANY)));
	int8_elements(arr, "ids", &idv, &n);
	ids = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		ids[i] = DatumGetInt64(idv[i]);
	pgjq_guard_ids(ids, n);
	pgjq_storage_begin();
	done = cancel_ids(ids, n);
	pgjq_storage_end();
	PG_RETURN_INT64(done);
}

/*
 * cancel_key(queue, fair_key): every unfinished job of the queue with that
 * fair key (NULL: the jobs without one) as cancel(id) does: the ready and
 * waiting ones end cancelled, the running ones are asked to stop.  The jobs
 * are those that exist when the call starts (storage_job.c lists them);
 * returns how many it cancelled or asked to stop.
 */
Datum
pgjq_cancel_key(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	char	   *key = PG_ARGISNULL(1) ? "" : text_to_cstring(PG_GETARG_TEXT_PP(1));
	PgjqQueue	queue;
	int64	   *ids;
	int			n;
	int64		done;

	pgjq_guard_queue(name, PGJQ_GUARD_USE);
	pgjq_storage_begin();
	pgjq_storage_queue_get_or_error(name, &queue);
	n = pgjq_storage_key_jobs(queue.queue_id, key, &ids);
	done = cancel_ids(ids, n);
	pgjq_storage_end();
	PG_RETURN_INT64(done);
}

Datum
pgjq_retry_dead(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	ArrayType  *ids = pgjq_arg_array(fcinfo, 1, "ids", INT8OID, false);
	PgjqQueue	queue;
	int64		n;

	if (ids && array_contains_nulls(ids))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not contain nulls")));
	pgjq_storage_begin();
	pgjq_storage_queue_lock(name, RowExclusiveLock);
	pgjq_guard_queue(name, PGJQ_GUARD_ADD);
	pgjq_storage_queue_get_or_error(name, &queue);
	n = pgjq_storage_retry_dead(queue.queue_id, ids, GetCurrentTimestamp());
	pgjq_storage_end();
	PG_RETURN_INT64(n);
}
