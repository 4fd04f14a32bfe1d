/*-------------------------------------------------------------------------
 *
 * queue.c
 *	  SQL API for queues: create_queue, alter_queue, drop_queue, pause,
 *	  resume, purge.  (list_queues is plain SQL in sql/pgjq.sql.)
 *
 * Settings and their ranges (NULL means the default on create, unchanged on
 * alter):
 *	  lease           (0, 7 days]       default 30 s
 *	  max_attempts    1 .. 10000        default 20
 *	  backoff_base    [0, 7 days]       default 1 s
 *	  backoff_max     [0, 30 days], >= backoff_base, default max(1 h, backoff_base)
 *	  retention       [0, 3650 days]    default 1 day
 *	  concurrency     0 .. 1000000      most jobs running at once; 0 = none
 *	  key_concurrency 0 .. 1000000      most running per fair_key; 0 = none
 *	  rate            [0, 1e6] / s      claims started per second; 0 = none
 *	  burst           0 .. 1000000      token bucket size; 0 = max(1, rate)
 *	  timeout         [0, 365 days]     execution deadline from a claim; 0 = none
 *	  key_rate        [0, 1e6] / s      claims started per second per fair key
 *	  key_burst       0 .. 1000000      its bucket size; 0 = max(1, key_rate)
 *
 * The limits live in shared memory (limits.c): setting one needs pgjq in
 * shared_preload_libraries.
 *
 * Every queue's jobs live in the ring engine (ring.h), which needs
 * shared_preload_libraries.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "state/metric_counters.h"
#include "common/args.h"
#include "state/limits.h"
#include "engine/engine.h"
#include "state/key_rate.h"
#include "state/ring_shmem.h"
#include "state/ring_xact.h"
#include "state/wait.h"

#include <math.h>

#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(pgjq_create_queue);
PG_FUNCTION_INFO_V1(pgjq_alter_queue);
PG_FUNCTION_INFO_V1(pgjq_drop_queue);
PG_FUNCTION_INFO_V1(pgjq_pause);
PG_FUNCTION_INFO_V1(pgjq_resume);
PG_FUNCTION_INFO_V1(pgjq_purge);

#define MAX_ATTEMPTS_LIMIT 10000

/* An optional limit argument: -1 when NULL, else 0 .. 1000000. */
static int32
limit_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	int32		v;

	if (PG_ARGISNULL(argno))
		return -1;
	v = PG_GETARG_INT32(argno);
	if (v < 0 || v > 1000000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 0 and 1000000", argname),
				 strcmp(argname, "burst") == 0 ?
				 errhint("0 means the larger of 1 and rate.") :
				 strcmp(argname, "key_burst") == 0 ?
				 errhint("0 means the larger of 1 and key_rate.") :
				 errhint("0 means no limit.")));
	return v;
}

/* A rate argument (claims per second): -1 when NULL, else [0, 1e6]. */
static double
rate_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	double		v;

	/* an argument the SQL declaration lacks (an older schema): unset */
	if (argno >= PG_NARGS() || PG_ARGISNULL(argno))
		return -1;
	v = PG_GETARG_FLOAT8(argno);
	if (isnan(v) || v < 0 || v > 1e6)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 0 and 1000000 per second", argname)));
	return v;
}

/* Read arguments 1..12 (lease .. key_burst); unset ones stay -1. */
static void
read_settings(FunctionCallInfo fcinfo, PgjqQueueSettings *s)
{
	s->lease_us = pgjq_arg_interval(fcinfo, 1, "lease", 0, false, 7 * USECS_PER_DAY, -1);
	if (PG_ARGISNULL(2))
		s->max_attempts = -1;
	else
	{
		s->max_attempts = PG_GETARG_INT32(2);
		if (s->max_attempts < 1 || s->max_attempts > MAX_ATTEMPTS_LIMIT)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_attempts must be between 1 and %d", MAX_ATTEMPTS_LIMIT)));
	}
	s->backoff_base_us = pgjq_arg_interval(fcinfo, 3, "backoff_base", 0, true, 7 * USECS_PER_DAY, -1);
	s->backoff_max_us = pgjq_arg_interval(fcinfo, 4, "backoff_max", 0, true, 30 * USECS_PER_DAY, -1);
	s->retention_us = pgjq_arg_interval(fcinfo, 5, "retention", 0, true, 3650 * USECS_PER_DAY, -1);
	s->concurrency = limit_arg(fcinfo, 6, "concurrency");
	s->key_concurrency = limit_arg(fcinfo, 7, "key_concurrency");
	s->rate = rate_arg(fcinfo, 8, "rate");
	s->burst = limit_arg(fcinfo, 9, "burst");
	s->timeout_us = pgjq_arg_interval(fcinfo, 10, "timeout", 0, true, 365 * USECS_PER_DAY, -1);
	s->key_rate = rate_arg(fcinfo, 11, "key_rate");
	s->key_burst = 12 < PG_NARGS() ? limit_arg(fcinfo, 12, "key_burst") : -1;
	if (s->concurrency > 0 || s->key_concurrency > 0 || s->rate > 0 || s->burst > 0 ||
		s->key_rate > 0 || s->key_burst > 0)
		pgjq_limits_require_shmem("a queue limit");
}

static void
check_backoff(int64 base_us, int64 max_us)
{
	if (max_us < base_us)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("backoff_max must not be less than backoff_base")));
}

Datum
pgjq_create_queue(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	PgjqQueueSettings s;

	read_settings(fcinfo, &s);
	if (s.lease_us < 0)
		s.lease_us = 30 * USECS_PER_SEC;
	if (s.max_attempts < 0)
		s.max_attempts = 20;
	if (s.backoff_base_us < 0)
		s.backoff_base_us = USECS_PER_SEC;
	if (s.backoff_max_us < 0)
		s.backoff_max_us = Max(USECS_PER_HOUR, s.backoff_base_us);
	if (s.retention_us < 0)
		s.retention_us = USECS_PER_DAY;
	check_backoff(s.backoff_base_us, s.backoff_max_us);
	pgjq_ring_require();

	pgjq_guard_queue(name, PGJQ_GUARD_CREATE);
	pgjq_storage_begin();
	if (!pgjq_storage_queue_insert(name, &s))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("queue \"%s\" already exists", name)));
	pgjq_storage_end();
	PG_RETURN_VOID();
}

Datum
pgjq_alter_queue(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	PgjqQueueSettings s;
	PgjqQueue	queue;

	read_settings(fcinfo, &s);
	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_begin();
	pgjq_storage_queue_get_or_error(name, &queue);
	check_backoff(s.backoff_base_us >= 0 ? s.backoff_base_us : queue.backoff_base_us,
				  s.backoff_max_us >= 0 ? s.backoff_max_us : queue.backoff_max_us);
	pgjq_storage_queue_update(queue.queue_id, &s);
	pgjq_storage_end();
	/* a limit raised or removed lets waiting claims take ready jobs */
	if (s.concurrency >= 0 || s.key_concurrency >= 0 || s.rate >= 0 || s.burst >= 0)
		pgjq_wait_note_ready(queue.queue_id, PG_INT32_MAX);
	if (s.key_concurrency >= 0)
		pgjq_ring_queue_altered(queue.queue_id);

	/*
	 * keys throttled under the old key_rate take the new one at their next
	 * claim
	 */
	if (s.key_rate >= 0 || s.key_burst >= 0)
	{
		pgjq_ring_rates_altered(queue.queue_id);
		pgjq_wait_note_ready(queue.queue_id, PG_INT32_MAX);
	}
	PG_RETURN_VOID();
}

Datum
pgjq_drop_queue(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	bool		force = PG_ARGISNULL(1) ? false : PG_GETARG_BOOL(1);
	PgjqQueue	queue;
	int64		running;

	pgjq_storage_begin();
	pgjq_storage_queue_lock(name, AccessExclusiveLock);
	/* after the lock: the guard's own (shared) would wait behind a drop */
	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_queue_get_or_error(name, &queue);
	{
		int64		ready;

		running = pgjq_ring_drop_jobs(queue.queue_id, true, force, &ready);
	}
	if (running == 0 || force)
		pgjq_storage_queue_delete(queue.queue_id);
	if (running > 0 && !force)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg_plural("queue \"%s\" has %lld running job",
							   "queue \"%s\" has %lld running jobs",
							   running, name, (long long) running),
				 errhint("Wait for them to finish, or use drop_queue(..., force => true).")));
	pgjq_storage_end();
	pgjq_limits_queue_dropped(queue.queue_id);
	pgjq_metrics_queue_dropped(queue.queue_id);
	PG_RETURN_VOID();
}

static void
set_paused(FunctionCallInfo fcinfo, bool paused)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	PgjqQueue	queue;

	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_begin();
	pgjq_storage_queue_get_or_error(name, &queue);
	pgjq_storage_queue_set_paused(queue.queue_id, paused);
	pgjq_storage_end();
	if (!paused)
		pgjq_wait_note_ready(queue.queue_id, PG_INT32_MAX);
}

Datum
pgjq_pause(PG_FUNCTION_ARGS)
{
	set_paused(fcinfo, true);
	PG_RETURN_VOID();
}

Datum
pgjq_resume(PG_FUNCTION_ARGS)
{
	set_paused(fcinfo, false);
	PG_RETURN_VOID();
}

Datum
pgjq_purge(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	PgjqQueue	queue;
	int64		n;

	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_begin();
	pgjq_storage_queue_get_or_error(name, &queue);
	n = pgjq_storage_queue_purge(queue.queue_id);
	{
		int64		ready;

		(void) pgjq_ring_drop_jobs(queue.queue_id, false, false, &ready);
		n += ready;
	}
	pgjq_storage_end();
	PG_RETURN_INT64(n);
}
