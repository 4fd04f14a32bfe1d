/*-------------------------------------------------------------------------
 *
 * moves.c
 *	  The node-side steps of pgjq.move_queues() (sql/pgjq.sql runs them on
 *	  the source and the target) and the setting that lets them pass the
 *	  guard.
 *
 * A move of routing shard S from node A to node B (sql/pgjq.sql,
 * move_queues; each step is its own transaction on its node, and each is
 * idempotent, so calling move_queues again after a crash or an error
 * between any two steps finishes the move, or undoes it, losing nothing):
 *   1. A: fence S (pgjq._citus_fence): a row in pgjq.queue_fence, then each
 *      of S's queue-name locks taken exclusively, so that every enqueue (and
 *      change to a queue) that passed the guard before has committed, and
 *      every later one sees the fence (those calls check the guard after
 *      taking that lock in shared mode, and the guard reads the fences with
 *      the latest snapshot after the invalidation the fence's commit sends)
 *      and is refused with PJ002, retryable.  Claims and outcomes go on.
 *      A's worker holds the schedules of S's queues (not fired, their next
 *      slot kept: pgjq_schedule_held_hook).
 *   2. B: the queues of S created, or updated, with A's settings
 *      (pgjq.citus_guard off: B does not serve S yet).
 *   3. A: wait until S's queues hold no unfinished job (workers finish what
 *      they hold; delegated claims still reach A); then the fence's state
 *      's' refuses claims too, and the final check (pgjq._citus_shard_live)
 *      runs under S's queue-name locks and the promotion lock
 *      (pgjq._citus_lock_shard): every enqueue, claim, outcome and
 *      promotion in flight has committed and published its jobs, so a job
 *      is counted as a row of pgjq.job or in the ring, never in neither.
 *      If it finds jobs, the fence goes back to 'f' and the drain goes on.
 *   4. B: what A's queues keep besides jobs, copied (A's state is frozen
 *      under 's'): dead jobs (same ids), dedup_for periods and key holds
 *      still in force.
 *   5. Citus moves S's shard group (the routing shard and the application's
 *      colocated shards) to B: from then on calls are delegated to B.
 *   6. B: A's schedules of S's queues (with their next slot), then A: those
 *      schedules, S's queues (only if they hold nothing live:
 *      pgjq._citus_release_queues refuses otherwise, with SQLSTATE 55006
 *      and the fence kept) with their carried dead jobs, and the fence.
 * If step 3 does not finish in time, the fence and B's copies are removed
 * and nothing has moved.
 *
 *-------------------------------------------------------------------------
 */
#include "citus/moves.h"
#include "citus/citus_mode.h"
#include "api/schedule.h"
#include "engine/engine.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"

PG_FUNCTION_INFO_V1(pgjq_citus_fence);
PG_FUNCTION_INFO_V1(pgjq_citus_unfence);
PG_FUNCTION_INFO_V1(pgjq_citus_lock_shard);
PG_FUNCTION_INFO_V1(pgjq_citus_history_ensure);

bool		pgjq_citus_guard_on = true;
int			pgjq_debug_move_stop_after = 0;

static bool schedule_held(const char *queue);

void
pgjq_citus_moves_init(void)
{
	DefineCustomBoolVariable("pgjq.citus_guard",
							 "Refuses pgjq calls on a Citus node that does not serve their queue or id.",
							 "Off only for pgjq.move_queues()'s own steps and for repairs by a superuser.",
							 &pgjq_citus_guard_on, true, PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq.debug_move_stop_after",
							"Test only: pgjq.move_queues() returns after this step (1-6), as if cut short there.",
							"0 (the default) runs every step.  For tests of a move resumed after a crash.",
							&pgjq_debug_move_stop_after, 0, 0, 6, PGC_SUSET, GUC_NOT_IN_SAMPLE,
							NULL, NULL, NULL);
	pgjq_schedule_held_hook = schedule_held;
}

/*
 * The worker's schedules hook (api/schedule.h): a schedule whose queue's
 * routing shard is fenced on this node is not fired; step 6 of the move
 * takes it to the new node with its next slot.  A fenced shard's queues get
 * no job from here after the drain, and none is skipped.
 */
static bool
schedule_held(const char *queue)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(queue)};

	if (!pgjq_citus_mode())
		return false;
	if (SPI_execute_with_args("SELECT 1 FROM pgjq.queue_fence f"
							  " WHERE f.shard OPERATOR(pg_catalog.=) pg_catalog.get_shard_id_for_distribution_column("
							  "       'pgjq.queue_route'::pg_catalog.regclass, $1)",
							  1, types, values, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "pgjq: could not read the fences");
	return SPI_processed > 0;
}

/* the queues of this node whose names hash to the routing shard */
static const char *queues_of_shard_sql =
"SELECT q.name FROM pgjq.queue q"
" WHERE pg_catalog.get_shard_id_for_distribution_column('pgjq.queue_route'::pg_catalog.regclass, q.name)"
"       OPERATOR(pg_catalog.=) $1 ORDER BY q.name";

static void
require_citus_mode(void)
{
	if (!pgjq_citus_mode())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this database is not in pgjq's Citus mode"),
				 errhint("Run SELECT pgjq.citus_setup() on the coordinator first.")));
}

/*
 * Each of the shard's queue-name locks, exclusively, in name order (one
 * order for every caller); returns how many queues.  Connected to SPI.
 */
static int
lock_shard_queues(int64 shard)
{
	Oid			types[1] = {INT8OID};
	Datum		values[1] = {Int64GetDatum(shard)};
	int			n;

	if (SPI_execute_with_args(queues_of_shard_sql, 1, types, values, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "pgjq: could not list the queues of shard %lld", (long long) shard);
	n = (int) SPI_processed;
	for (int i = 0; i < n; i++)
		pgjq_storage_queue_lock(SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1),
								AccessExclusiveLock);
	return n;
}

/* pgjq._citus_fence(shard, target_group, state): steps 1 and 3 (returns the queues) */
Datum
pgjq_citus_fence(PG_FUNCTION_ARGS)
{
	int64		shard = PG_GETARG_INT64(0);
	int32		target = PG_GETARG_INT32(1);
	char		state = PG_GETARG_CHAR(2);
	Oid			types[3] = {INT8OID, INT4OID, CHAROID};
	Datum		values[3] = {Int64GetDatum(shard), Int32GetDatum(target), CharGetDatum(state)};
	int			n;

	require_citus_mode();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (state != 'f' && state != 's')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("state must be 'f' (enqueues refused) or 's' (claims too)")));
	SPI_execute_with_args("INSERT INTO pgjq.queue_fence (shard, target_group, state) VALUES ($1, $2, $3)"
						  " ON CONFLICT (shard) DO UPDATE SET target_group = excluded.target_group,"
						  "                                   state = excluded.state",
						  3, types, values, NULL, false, 0);
	/* every backend rereads the fences at its next guarded call */
	CacheInvalidateRelcacheByRelid(pgjq_citus_route_rel());
	n = lock_shard_queues(shard);
	SPI_finish();
	PG_RETURN_INT32(n);
}

/* pgjq._citus_unfence(shard): the end of step 5, or of a move given up */
Datum
pgjq_citus_unfence(PG_FUNCTION_ARGS)
{
	int64		shard = PG_GETARG_INT64(0);
	Oid			types[1] = {INT8OID};
	Datum		values[1] = {Int64GetDatum(shard)};
	bool		found;

	require_citus_mode();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	SPI_execute_with_args("DELETE FROM pgjq.queue_fence WHERE shard OPERATOR(pg_catalog.=) $1",
						  1, types, values, NULL, false, 0);
	found = SPI_processed > 0;
	SPI_finish();
	CacheInvalidateRelcacheByRelid(pgjq_citus_route_rel());
	PG_RETURN_BOOL(found);
}

/*
 * pgjq._citus_lock_shard(shard): the locks of a move's final drain check
 * and of its release (steps 3 and 6), held to the caller's transaction's
 * end: each of the shard's queue-name locks exclusively (every enqueue,
 * claim and outcome in flight has committed, and none starts), then the
 * promotion lock in share mode (every promotion in flight has published its
 * jobs in the ring: storage_queue.c).  The caller counts afterwards, in a
 * statement of its own (a snapshot taken after the locks).  Returns how
 * many queues.
 */
Datum
pgjq_citus_lock_shard(PG_FUNCTION_ARGS)
{
	int64		shard = PG_GETARG_INT64(0);
	int			n;

	require_citus_mode();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	n = lock_shard_queues(shard);
	SPI_finish();
	pgjq_storage_promotions_wait();
	PG_RETURN_INT32(n);
}

/*
 * pgjq._citus_history_ensure(finished_at): the history partition of that
 * hour exists (step 4 copies dead jobs into it); returns its name.
 */
Datum
pgjq_citus_history_ensure(PG_FUNCTION_ARGS)
{
	TimestampTz ts = PG_GETARG_TIMESTAMPTZ(0);

	require_citus_mode();
	pgjq_storage_begin();
	pgjq_history_ensure(ts);
	pgjq_storage_end();
	PG_RETURN_VOID();
}
