/*-------------------------------------------------------------------------
 *
 * ownership.c
 *	  The guard: a call runs only on the node that serves its queue or
 *	  issued its ids; route(), and the SQL-level checks of the queue-first
 *	  forms and job(id).
 *
 * A queue is served by the node group that holds the shard of
 * pgjq.queue_route its name hashes to (Citus's own hashing, asked through
 * get_shard_id_for_distribution_column), unless pgjq.move_queues() is moving
 * that shard: then its state in pgjq.queue_fence (local to each node)
 * decides what the source still does until the switch (moves.c, and the
 * table in api/guard.h): state 'f' refuses enqueues and changes to the
 * queue with a retryable SQLSTATE (PJ002); state 's' (the switch is near)
 * also claims, but complete_and_claim keeps its outcomes and claims nothing;
 * outcomes are served.  Once the placement is another node's, what uses or
 * changes the queue is refused there (PJ001, naming it), and enqueues and
 * claims get PJ002 until the move drops the fence, PJ001 after.
 *
 * The answer per queue name is cached per backend, with the fences, until
 * citus_mode.c's generation moves (a relcache invalidation of the routing
 * or the fence table).  Both are read with the latest snapshot, never the
 * caller's (see plan_fences): a REPEATABLE READ transaction, or a statement
 * that waited on a fence's lock, would otherwise cache an answer from before
 * the fence (review 0.4.0 C1, H1).  Ids carry the group that issued them in
 * their high bits (citus_mode.h), so an id-only outcome is checked with a
 * shift; only an id another group issued costs a look at this node's
 * tables, for a job a move carried here with its id.
 *
 * Every call in Citus mode first checks that this node's ids are in its
 * group's range (citus_mode.c, once per backend).
 *
 *-------------------------------------------------------------------------
 */
#include "citus/ownership.h"
#include "citus/citus_mode.h"
#include "citus/moves.h"
#include "common/spi_plans.h"
#include "engine/engine.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

PG_FUNCTION_INFO_V1(pgjq_route);
PG_FUNCTION_INFO_V1(pgjq_serve);
PG_FUNCTION_INFO_V1(pgjq_job_guard);

typedef struct QueueOwner
{
	char		name[PGJQ_MAX_QUEUE_NAME + 1];	/* hash key */
	int64		shard;
	int32		group;			/* -1: no placement (a shard being created) */
	char		fence;			/* this node's fence of the shard, or 0 */
} QueueOwner;

static HTAB *owners = NULL;
static uint64 owners_generation = 0;

/* more queue names than this and the cache starts again (per-tenant names) */
#define MAX_OWNERS 4096

#define MAX_FENCES 1024
static int	nfences = 0;
static int64 fence_shard[MAX_FENCES];
static char fence_state[MAX_FENCES];

/*
 * The fences and placements are read with the latest snapshot, not the
 * caller's.  A fence (or Citus's placement change at a move's switch) sends
 * its relcache invalidation at commit, after its commit is visible to new
 * snapshots and before its locks are released; a call that waited on the
 * queue-name lock the fence held processes that invalidation right after
 * the lock (pgjq_storage_queue_lock), so a snapshot taken then shows every
 * commit that sent one.  The caller's snapshot may be older: a READ
 * COMMITTED statement's was taken before its lock wait, a REPEATABLE READ
 * transaction's when it began; read with it, the cache would hold "no
 * fence" (or the old placement) until the next invalidation, which may
 * never come (a session that enqueues in a loop was never fenced).
 */
static PgjqPlan plan_fences = {
	"SELECT shard, state FROM pgjq.queue_fence ORDER BY shard LIMIT " CppAsString2(MAX_FENCES) " + 1",
	0, {InvalidOid}
};

static PgjqPlan plan_owner = {
	"SELECT s.shard, (SELECT p.groupid FROM pg_catalog.pg_dist_placement p"
	"                  WHERE p.shardid OPERATOR(pg_catalog.=) s.shard"
	"                  ORDER BY p.placementid LIMIT 1)"
	"  FROM (SELECT pg_catalog.get_shard_id_for_distribution_column("
	"          'pgjq.queue_route'::pg_catalog.regclass, $1) AS shard) s",
	1, {TEXTOID}
};

static void
owners_reset(void)
{
	HASHCTL		ctl;

	if (owners != NULL)
		hash_destroy(owners);
	owners = NULL;
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = PGJQ_MAX_QUEUE_NAME + 1;
	ctl.entrysize = sizeof(QueueOwner);
	ctl.hcxt = TopMemoryContext;
	owners = hash_create("pgjq queue owners", 64, &ctl, HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
}

/*
 * (Re)load the fences when the generation moved; drop the owners.  The
 * generation is the one seen before the load, and recorded only once the
 * load is complete: an invalidation during the load, or an error (a cancel,
 * a statement_timeout), makes the next call load again.
 */
static void
owners_fresh(void)
{
	uint64		gen = pgjq_citus_generation();

	if (owners != NULL && owners_generation == gen)
		return;
	owners_generation = 0;
	owners_reset();
	nfences = 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (pgjq_spi_run_latest(&plan_fences, NULL, NULL, 0) != SPI_OK_SELECT)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("could not read pgjq.queue_fence"),
				 errhint("Reinstall pgjq on this node.")));
	if (SPI_processed > MAX_FENCES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("this node has more than %d fenced routing shards", MAX_FENCES),
				 errdetail("Each row of pgjq.queue_fence is a move of a routing shard from this node "
						   "that has not finished."),
				 errhint("Finish the moves (CALL pgjq.move_queues() again), or use fewer routing "
						 "shards.")));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		fence_shard[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
		fence_state[i] = DatumGetChar(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull));
	}
	nfences = (int) SPI_processed;
	SPI_finish();
	owners_generation = gen;
}

static char
fence_of(int64 shard)
{
	for (int i = 0; i < nfences; i++)
		if (fence_shard[i] == shard)
			return fence_state[i];
	return 0;
}

/* The shard and the group serving a queue name (cached). */
static QueueOwner *
owner_of(const char *queue)
{
	QueueOwner *o;
	bool		found;
	char		key[PGJQ_MAX_QUEUE_NAME + 1];
	Datum		values[1];
	int64		shard = 0;
	int32		group = -1;
	bool		isnull;
	Datum		g;

	owners_fresh();
	memset(key, 0, sizeof(key));
	strlcpy(key, queue, sizeof(key));
	o = hash_search(owners, key, HASH_FIND, NULL);
	if (o != NULL)
		return o;
	values[0] = CStringGetTextDatum(queue);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (pgjq_spi_run_latest(&plan_owner, values, NULL, 1) != SPI_OK_SELECT || SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("could not read the routing shard of queue \"%s\"", queue),
				 errhint("Run SELECT pgjq.citus_setup() on the coordinator.")));
	shard = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	g = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	if (!isnull)
		group = DatumGetInt32(g);
	SPI_finish();
	if (hash_get_num_entries(owners) >= MAX_OWNERS)
		owners_reset();
	o = hash_search(owners, key, HASH_ENTER, &found);
	o->shard = shard;
	o->group = group;
	o->fence = fence_of(shard);
	return o;
}

pg_noreturn static void wrong_node(const char *queue, const QueueOwner *o);
pg_noreturn static void moving(const char *queue, const QueueOwner *o);

static void
wrong_node(const char *queue, const QueueOwner *o)
{
	char	   *host;
	int32		port;

	pgjq_citus_node_of_group(o->group, &host, &port);
	ereport(ERROR,
			(errcode(PGJQ_ERRCODE_WRONG_NODE),
			 errmsg("queue \"%s\" is served by node %s:%d, not by this one", queue, host, port),
			 errdetail("Under Citus each queue lives on the node that holds its routing shard (%lld "
					   "of pgjq.queue_route); this call was not delegated there, or it came "
					   "straight to a node that does not serve the queue.", (long long) o->shard),
			 errhint("Call it as SELECT pgjq.f(...) with constant arguments through any node, "
					 "or connect to the node that pgjq.route('%s') names.", queue)));
}

static void
moving(const char *queue, const QueueOwner *o)
{
	ereport(ERROR,
			(errcode(PGJQ_ERRCODE_QUEUE_MOVING),
			 errmsg("queue \"%s\" is moving to another node", queue),
			 errdetail("pgjq.move_queues() is moving routing shard %lld; enqueues and changes "
					   "to the queue (and, in its last moments, claims) resume on the new node "
					   "when it switches; outcomes are served meanwhile.",
					   (long long) o->shard),
			 errhint("Retry the call in a moment.")));
}

/*
 * The queue guard (guard.h's hook): errors unless this node serves the call
 * (the table in guard.h); false only for a CYCLE call in a move's last
 * phase.  The caller holds the queue-name lock where its call needs one
 * (enqueues, claims, drop_queue); for an ALTER call it is taken here.
 */
bool
pgjq_citus_guard_queue(const char *queue, PgjqGuardCall call)
{
	QueueOwner *o;

	if (PGJQ_IN_BGWORKER || !pgjq_citus_guard_on || !pgjq_citus_mode())
		return true;
	pgjq_citus_require_id_range();
	if (call == PGJQ_GUARD_ALTER || call == PGJQ_GUARD_UNSCHEDULE)
		pgjq_storage_queue_lock(queue, RowExclusiveLock);
	o = owner_of(queue);
	if (call == PGJQ_GUARD_UNSCHEDULE)
	{
		if (o->fence != 0 && o->group == pgjq_citus_local_group())
			moving(queue, o);
		return true;
	}
	if (o->fence != 0)
	{
		bool		switched = o->group != pgjq_citus_local_group();

		/*
		 * This node is the source of a move of the queue's shard.  Before the
		 * switch it serves the outcomes of what it holds, and claims until
		 * the move's last phase ('s'); what adds jobs or changes the queue
		 * waits for the new node (the target's copy was made from this one
		 * when the move began).  After the switch (the placement is the
		 * target's, this node's copies not dropped yet) what uses or changes
		 * the queue is refused naming the target; enqueues and claims keep
		 * getting "moving", retryable: a coordinator may have delegated them
		 * here on the metadata of a moment before, and a retry through it
		 * reaches the target.  Once the move drops the fence, PJ001 below.
		 */
		switch (call)
		{
			case PGJQ_GUARD_USE:
				if (switched)
					wrong_node(queue, o);
				return true;
			case PGJQ_GUARD_ALTER:
				if (switched)
					wrong_node(queue, o);
				break;
			case PGJQ_GUARD_CLAIM:
				if (!switched && o->fence == 'f')
					return true;
				break;
			case PGJQ_GUARD_CYCLE:
				if (!switched)
					return o->fence == 'f';
				break;
			case PGJQ_GUARD_CREATE:
			case PGJQ_GUARD_ADD:
			case PGJQ_GUARD_UNSCHEDULE:
				break;
		}
		moving(queue, o);
	}
	if (o->group != pgjq_citus_local_group())
		wrong_node(queue, o);

	/*
	 * Served here but not here: never created, or Citus moved the shard here
	 * behind pgjq's back (the queue and its jobs stayed where they were). The
	 * same SQLSTATE as any unknown queue, with the reason.
	 */
	if (call != PGJQ_GUARD_CREATE)
	{
		PgjqQueue	q;

		if (!pgjq_storage_queue_get(queue, &q))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("queue \"%s\" does not exist", queue),
					 errdetail("This node holds the queue's routing shard (%lld of pgjq.queue_route) "
							   "but no such queue: it was never created, or Citus moved the shard "
							   "here without pgjq.move_queues(), and the queue and its jobs "
							   "stayed on the node that had it.", (long long) o->shard),
					 errhint("Move the shard back with citus_move_shard_placement(), then use "
							 "CALL pgjq.move_queues() to move queues.")));
	}
	return true;
}

/*
 * The id guard (guard.h's hook): errors unless this node issued each id,
 * or holds its job (a move carries dead jobs to the target, where they keep
 * the id their first node issued).  The second look is a query, made only
 * where the call would otherwise be refused.
 */
void
pgjq_citus_guard_ids(const int64 *ids, int n)
{
	int32		local;

	if (PGJQ_IN_BGWORKER || !pgjq_citus_guard_on || !pgjq_citus_mode())
		return;
	pgjq_citus_require_id_range();
	local = pgjq_citus_local_group();
	for (int i = 0; i < n; i++)
	{
		int32		g = pgjq_citus_group_of_id(ids[i]);

		if (g >= 0 && g != local && !pgjq_storage_job_here(ids[i]))
		{
			char	   *host;
			int32		port;

			pgjq_citus_node_of_group(g, &host, &port);
			ereport(ERROR,
					(errcode(PGJQ_ERRCODE_WRONG_NODE),
					 errmsg("job %lld was issued by node %s:%d, not by this one",
							(long long) ids[i], host, port),
					 errdetail("Under Citus a job's id names the node group that issued it (%d) and "
							   "that node holds the job, unless a move carried it elsewhere.", g),
					 errhint("Send the call to that node, or use the queue-first form "
							 "(complete_in, fail_in, heartbeat_in, snooze_in, cancel_in, job_in) "
							 "through any node.")));
		}
	}
}

/*
 * pgjq.route(queue): the node that serves the queue, for workers that
 * connect there directly (no hop through another node).
 */
Datum
pgjq_route(PG_FUNCTION_ARGS)
{
	char	   *queue;
	QueueOwner *o;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	char	   *host;
	int32		port;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be NULL")));
	queue = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (strlen(queue) == 0 || strlen(queue) > PGJQ_MAX_QUEUE_NAME)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("queue name must be 1 to %d bytes long", PGJQ_MAX_QUEUE_NAME)));
	if (!pgjq_citus_mode())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("route() needs pgjq on Citus"),
				 errdetail("This database has no pgjq.queue_route: every queue is served by this server."),
				 errhint("On a Citus coordinator, run SELECT pgjq.citus_setup() first.")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgjq: route() must return a row");
	o = owner_of(queue);
	pgjq_citus_node_of_group(o->group, &host, &port);
	values[0] = CStringGetTextDatum(host);
	values[1] = Int32GetDatum(port);
	values[2] = Int32GetDatum(o->group);
	values[3] = Int64GetDatum(o->shard);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}

/*
 * pgjq._serve(queue): the guard of the queue-first forms (a USE call), and
 * the queue must exist here, as for every queue-first call
 */
Datum
pgjq_serve(PG_FUNCTION_ARGS)
{
	char	   *queue;
	PgjqQueue	q;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queue must not be NULL")));
	queue = text_to_cstring(PG_GETARG_TEXT_PP(0));
	pgjq_citus_guard_queue(queue, PGJQ_GUARD_USE);
	pgjq_storage_queue_get_or_error(queue, &q); /* cached: no SPI needed */
	PG_RETURN_VOID();
}

/*
 * pgjq._job_guard(id): job(id)'s first branch: no row, or the wrong-node
 * error for an id another node issued.
 */
Datum
pgjq_job_guard(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	pgjq_citus_guard_ids(&id, 1);
	rsinfo->isDone = ExprEndResult;
	PG_RETURN_NULL();
}
