/*-------------------------------------------------------------------------
 *
 * maintenance.c
 *	  promote(), rescue(), prune(), maintain(), _ring_reclaim() and
 *	  _exclude_worker():
 *	  SQL-callable, and the steps the background worker schedules (bgworker.c
 *	  only decides when).
 *
 * Each pgjq_maintenance_* function runs inside the caller's transaction and
 * connects to SPI itself.  The SQL functions work through the whole backlog
 * in that one transaction (the caller's: it decides when to commit, and a
 * large backlog stays locked and invisible to claimers until then).  The
 * background worker instead calls the *_chunk and prune_* functions, each in
 * a transaction of its own: rescue and promote commit every
 * PGJQ_MAINTENANCE_CHUNK jobs, prune every partition (storage_history.c
 * says why).
 *
 *-------------------------------------------------------------------------
 */
#include "api/maintenance.h"
#include "common/args.h"
#include "state/metric_counters.h"
#include "engine/engine.h"
#include "api/outcome.h"
#include "api/schedule.h"
#include "state/ring_shmem.h"

#include "access/htup_details.h"
#include "access/xlog.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_promote);
PG_FUNCTION_INFO_V1(pgjq_rescue);
PG_FUNCTION_INFO_V1(pgjq_prune);
PG_FUNCTION_INFO_V1(pgjq_maintain);
PG_FUNCTION_INFO_V1(pgjq_ring_reclaim_sql);
PG_FUNCTION_INFO_V1(pgjq_exclude_worker);

#define DEDUP_PRUNE_CHUNK 10000


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

/*
 * Promote up to `limit` due jobs; returns how many.  They move into the
 * ring (ring.h); those it has no room for become ready rows of pgjq.job,
 * which claims move into the ring later.
 */
static int64
promote_chunk(int limit)
{
	int64		n;
	TimestampTz now = GetCurrentTimestamp();

	pgjq_storage_begin();
	n = pgjq_ring_promote(now, limit);
	n += pgjq_storage_promote(now, limit - (int) n);
	pgjq_storage_end();
	return n;
}

/*
 * Rescue up to `limit` expired leases: each counts as a failed attempt with
 * error "lease expired": retried after the queue's backoff, dead when its
 * attempts are spent, cancelled if that was requested.  Returns how many.
 */
static int64
rescue_chunk(int limit)
{
	TimestampTz now = GetCurrentTimestamp();
	int64	   *ids = palloc(sizeof(int64) * limit);
	int64	   *toks = palloc(sizeof(int64) * limit);
	int			n;

	pgjq_storage_begin();
	n = pgjq_ring_expired(now, limit, ids, toks);

	/*
	 * each unless a heartbeat extended the lease or an outcome ended it
	 * meanwhile
	 */
	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		pgjq_metrics_call_begin();
		if (pgjq_outcome_rescue_ring(ids[i], toks[i], now) != 0)
			pgjq_metrics_job_outcome(toks[i], PGJQ_M_RESCUED, now);
	}
	pgjq_storage_end();
	pfree(ids);
	pfree(toks);
	return n;
}

/* The worker's steps: one chunk each (it commits in between). */
int64
pgjq_maintenance_promote_chunk(void)
{
	return promote_chunk(PGJQ_MAINTENANCE_CHUNK);
}

int64
pgjq_maintenance_rescue_chunk(void)
{
	return rescue_chunk(PGJQ_MAINTENANCE_CHUNK);
}

/*
 * All due jobs, in the caller's transaction; first the waiting jobs whose
 * dependencies finished (deps.c), so that those due now are promoted too.
 */
int64
pgjq_maintenance_promote(void)
{
	int64		total = 0;
	int64		n;

	(void) pgjq_deps_resolve_all();

	do
	{
		CHECK_FOR_INTERRUPTS();
		n = promote_chunk(PGJQ_MAINTENANCE_CHUNK);
		total += n;
	} while (n == PGJQ_MAINTENANCE_CHUNK);
	return total;
}

/* All expired leases, in the caller's transaction. */
int64
pgjq_maintenance_rescue(void)
{
	int64		total = 0;
	int64		n;

	do
	{
		CHECK_FOR_INTERRUPTS();
		n = rescue_chunk(PGJQ_MAINTENANCE_CHUNK);
		total += n;
	} while (n == PGJQ_MAINTENANCE_CHUNK);
	return total;
}

/* All expired history, in the caller's transaction. */
int64
pgjq_maintenance_prune(void)
{
	int64		n;

	pgjq_storage_begin();
	n = pgjq_history_prune(GetCurrentTimestamp());
	/* and the dedup_for keys that ended (not counted: they are no jobs) */
	while (pgjq_dedup_prune(GetCurrentTimestamp(), DEDUP_PRUNE_CHUNK) == DEDUP_PRUNE_CHUNK)
		CHECK_FOR_INTERRUPTS();
	pgjq_storage_end();
	return n;
}

/*
 * The worker's first prune step: create partitions ahead, record queues,
 * delete a chunk of dedup_for keys that ended.
 */
void
pgjq_maintenance_prune_prepare(void)
{
	pgjq_storage_begin();
	pgjq_history_prepare(GetCurrentTimestamp());
	(void) pgjq_dedup_prune(GetCurrentTimestamp(), DEDUP_PRUNE_CHUNK);
	pgjq_storage_end();
}

/*
 * The worker's step on every pass: summarize job_done's filled BRIN ranges,
 * so that pgjq.job(id) never reads more than the range still filling.
 */
int64
pgjq_maintenance_summarize(void)
{
	int64		n;

	pgjq_storage_begin();
	n = pgjq_history_summarize(GetCurrentTimestamp());
	pgjq_storage_end();
	return n;
}

/*
 * The worker's next prune step: one expired partition, skipping the first
 * `skip` (see pgjq_history_prune_one for the result).  *pruned counts
 * partitions emptied.
 */
int
pgjq_maintenance_prune_one(int skip, int64 *pruned)
{
	int			r;

	pgjq_storage_begin();
	r = pgjq_history_prune_one(GetCurrentTimestamp(), skip, pruned);
	pgjq_storage_end();
	return r;
}

/*
 * One step of giving the ring's space back (truncate its oldest slot, or
 * copy that slot's stragglers forward), in the caller's transaction.
 */
int64
pgjq_maintenance_ring_reclaim(int limit)
{
	int64		n;

	pgjq_storage_begin();
	n = pgjq_ring_reclaim(limit);
	pgjq_storage_end();
	return n;
}

int64
pgjq_maintenance_ring_reclaim_chunk(void)
{
	return pgjq_maintenance_ring_reclaim(PGJQ_MAINTENANCE_CHUNK);
}

/* pgjq._ring_reclaim(max_jobs) */
Datum
pgjq_ring_reclaim_sql(PG_FUNCTION_ARGS)
{
	int32		max_jobs = PG_GETARG_INT32(0);

	if (max_jobs < 1 || max_jobs > PGJQ_RING_RECLAIM_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_jobs must be between 1 and %d", PGJQ_RING_RECLAIM_MAX)));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("pgjq maintenance cannot run during recovery"),
				 errhint("The background worker of the primary runs it.")));
	pgjq_ring_require();
	PG_RETURN_INT64(pgjq_maintenance_ring_reclaim(max_jobs));
}

/* When the worker must look again: the next due job or lease expiry. */
TimestampTz
pgjq_maintenance_next_deadline(void)
{
	TimestampTz t;

	pgjq_storage_begin();
	t = Min(pgjq_storage_next_deadline(), pgjq_ring_next_deadline());
	t = Min(t, pgjq_schedule_next_slot());
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

/*
 * pgjq._exclude_worker(): the first statement of every update script from
 * 0.4.1 on.  The extension's lock, exclusively, until the update commits:
 * the background worker's steps take it in share mode before they touch any
 * of pgjq's relations, and step aside while DDL holds it (bgworker.c), so
 * the script's DDL never waits for a step that waits for it.
 */
Datum
pgjq_exclude_worker(PG_FUNCTION_ARGS)
{
	Oid			ext = get_extension_oid("pgjq", true);

	if (!OidIsValid(ext))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("extension \"pgjq\" does not exist")));
	LockDatabaseObject(ExtensionRelationId, ext, 0, AccessExclusiveLock);
	PG_RETURN_VOID();
}
