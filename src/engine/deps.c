/*-------------------------------------------------------------------------
 *
 * deps.c
 *	  Dependencies between jobs: enqueue(..., after) makes a job wait in
 *	  pgjq.job (state 'w') until every job it names has finished; the
 *	  background worker then releases it (ready, or scheduled if it has a
 *	  run_at), or cancels it if a dependency ended dead or cancelled (unless
 *	  on_dependency_failure => 'run').
 *
 * Durable state: the waiting row (deps_left = edges still open) and one
 * pgjq.job_dependency row per open edge.  Only the worker deletes edges and
 * releases or cancels waiting jobs (one writer, so no two sessions ever
 * count the same edge), in one transaction per chunk.
 *
 * How the worker learns that a dependency finished, at no cost to jobs that
 * nobody depends on: shared memory holds the set of dependency targets,
 * (database, job id) with the number of edges that name it.  An enqueue adds
 * its targets before it commits; a transaction that finishes jobs keeps their
 * ids and, once its commit is visible, looks them up in the set, only when
 * the set is not empty (one atomic read otherwise), and queues an event for
 * each target it finished.  An enqueue's commit also queues a "check" event
 * for each new waiting job, which covers a dependency that finished before
 * the enqueue committed: the worker reads each of the job's dependencies
 * then.  Either the finishing commit finds the target in the set, or the
 * worker's check (after the enqueue's commit) sees the dependency finished.
 * The events are hints: the worker decides from job(id) with a fresh
 * snapshot, so a spurious event costs one look.
 *
 * Bounds: pgjq.max_dependency_targets entries in the set (an enqueue that
 * needs more fails with a hint), DEP_EVENTS queued events (when full, a
 * counter tells each worker to look at all its open edges once).  After a
 * restart the set is empty and each worker's first pass rebuilds it from
 * pgjq.job_dependency and looks at every target, which also covers the
 * events a crash lost.  Targets stay in the set until the worker has closed
 * their edges; an aborted enqueue takes its own out again.
 *
 * Locking: dep_lock guards the set and the event queue; ntargets is read
 * without it.  Nothing here runs under another pgjq lock.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/deps.h"
#include "state/limits.h"
#include "engine/ring.h"
#include "common/spi_plans.h"
#include "engine/storage_internal.h"
#include "common/guc.h"
#include "engine/engine.h"
#include "state/worker_slots.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#define DEP_EVENTS		8192

#define EV_FINISHED		'f'		/* a target finished */
#define EV_CHECK		'j'		/* a new waiting job: look at its dependencies */
#define EV_ALL			'a'		/* jobs nobody can name finished (a dropped
								 * queue): look at every target */

/* no padding: the whole struct is hashed (HASH_BLOBS) */
typedef struct DepKey
{
	int64		dboid;
	int64		id;
} DepKey;

typedef struct DepTarget
{
	DepKey		key;
	int64		edges;			/* edges that name it, committed or not */
} DepTarget;

typedef struct DepEvent
{
	Oid			dboid;
	char		kind;
	char		how;			/* EV_FINISHED: how the job ended
								 * (PGJQ_FINISHED_*) */
	int64		id;
} DepEvent;

typedef struct DepShared
{
	LWLock	   *lock;
	pg_atomic_uint32 ntargets;
	pg_atomic_uint64 overflows; /* times the event queue was full */
	int			nevents;
	DepEvent	events[DEP_EVENTS];
} DepShared;

int			pgjq_max_dependency_targets = 65536;

static DepShared *dshared = NULL;
static HTAB *dtargets = NULL;

/* Growable int64 lists of this transaction, in TopMemoryContext. */
typedef struct IdList
{
	int64	   *v;
	int			n;
	int			max;
} IdList;

static IdList finished;			/* jobs this transaction finished, and how
								 * (pairs: id, PGJQ_FINISHED_*) */
static bool finished_all = false;	/* and jobs it cannot name */
static IdList added;			/* targets this transaction added (pairs: id,
								 * edges) */
static IdList waiting;			/* waiting jobs it enqueued */
static IdList closed;			/* the worker: edges it closed (pairs: id,
								 * edges) */
static bool callback_registered = false;

/* the worker: look at every target in the next chunk (first pass, lost events) */
static bool need_full = true;
static uint64 seen_overflows = 0;
static bool full_pending = false;	/* this transaction is a full look */
static bool events_taken = false;	/* this transaction took events */
static bool gone_looked = false;	/* the worker looked for gone jobs once */
static bool gone_pending = false;	/* this transaction looks for them */
static TimestampTz last_full = 0;	/* the worker's last full look began */

static void
list_add(IdList *l, int64 v)
{
	if (l->n == l->max)
	{
		int			m = Max(64, l->max * 2);

		l->v = l->v ? repalloc(l->v, sizeof(int64) * m)
			: MemoryContextAlloc(TopMemoryContext, sizeof(int64) * m);
		l->max = m;
	}
	l->v[l->n++] = v;
}

/* ---------------------------------------------------------------- shmem */

void
pgjq_deps_startup(void)
{
	DefineCustomIntVariable("pgjq.max_dependency_targets",
							"Most jobs that waiting jobs can depend on at once, over all databases.",
							"Each costs about 40 bytes of shared memory; an enqueue that needs more fails.",
							&pgjq_max_dependency_targets,
							65536, 16, 16 * 1024 * 1024,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
}

Size
pgjq_deps_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(DepShared)),
					hash_estimate_size(pgjq_max_dependency_targets, sizeof(DepTarget)));
}

void
pgjq_deps_shmem_init(bool found_unused)
{
	bool		found;
	HASHCTL		ctl;

	dshared = ShmemInitStruct("pgjq dependencies", sizeof(DepShared), &found);
	if (!found)
	{
		memset(dshared, 0, sizeof(DepShared));
		dshared->lock = &(GetNamedLWLockTranche("pgjq"))[5].lock;
		pg_atomic_init_u32(&dshared->ntargets, 0);
		pg_atomic_init_u64(&dshared->overflows, 0);
	}
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(DepKey);
	ctl.entrysize = sizeof(DepTarget);
	dtargets = ShmemInitHash("pgjq dependency targets", pgjq_max_dependency_targets,
							 pgjq_max_dependency_targets, &ctl, HASH_ELEM | HASH_BLOBS);
}

/* Queue one event for this database's worker; caller holds dep_lock. */
static void
push_event(char kind, int64 id, char how)
{
	if (dshared->nevents >= DEP_EVENTS)
	{
		pg_atomic_fetch_add_u64(&dshared->overflows, 1);
		return;
	}
	dshared->events[dshared->nevents].dboid = MyDatabaseId;
	dshared->events[dshared->nevents].kind = kind;
	dshared->events[dshared->nevents].how = how;
	dshared->events[dshared->nevents].id = id;
	dshared->nevents++;
}

/* Take `edges` off target id (or all of them, edges < 0); caller holds dep_lock. */
static void
target_release(int64 id, int64 edges)
{
	DepKey		key = {MyDatabaseId, id};
	DepTarget  *t = hash_search(dtargets, &key, HASH_FIND, NULL);

	if (t == NULL)
		return;
	t->edges -= edges;
	if (t->edges <= 0)
	{
		hash_search(dtargets, &key, HASH_REMOVE, NULL);
		pg_atomic_fetch_sub_u32(&dshared->ntargets, 1);
	}
}

/* ------------------------------------------------------- commit and abort */

static void
reset_lists(void)
{
	finished.n = 0;
	finished_all = false;
	added.n = 0;
	waiting.n = 0;
	closed.n = 0;
	full_pending = false;
	events_taken = false;
	gone_pending = false;
}

/*
 * After a commit (a resource-release callback: it runs after every commit
 * callback, the ring's included, so a finished job no longer shows as
 * running to the worker it wakes): the events for the worker.  Nothing here
 * may fail.
 */
static bool committed = false;

static void
resource_callback(ResourceReleasePhase phase, bool isCommit, bool isTopLevel, void *arg)
{
	bool		wake = false;

	if (phase != RESOURCE_RELEASE_AFTER_LOCKS || !isTopLevel || !committed)
		return;
	committed = false;
	if (dshared != NULL &&
		(waiting.n > 0 || closed.n > 0 ||
		 ((finished.n > 0 || finished_all) && pg_atomic_read_u32(&dshared->ntargets) > 0)))
	{
		LWLockAcquire(dshared->lock, LW_EXCLUSIVE);
		for (int i = 0; i + 1 < closed.n; i += 2)
			target_release(closed.v[i], closed.v[i + 1]);
		if (pg_atomic_read_u32(&dshared->ntargets) > 0)
		{
			if (finished_all)
			{
				push_event(EV_ALL, 0, 0);
				wake = true;
			}
			else
				for (int i = 0; i + 1 < finished.n; i += 2)
				{
					DepKey		key = {MyDatabaseId, finished.v[i]};

					if (hash_search(dtargets, &key, HASH_FIND, NULL) != NULL)
					{
						push_event(EV_FINISHED, finished.v[i], (char) finished.v[i + 1]);
						wake = true;
					}
				}
		}
		for (int i = 0; i < waiting.n; i++)
			push_event(EV_CHECK, waiting.v[i], 0);
		wake = wake || waiting.n > 0;
		LWLockRelease(dshared->lock);
	}
	if (full_pending)
		need_full = false;
	if (gone_pending)
		gone_looked = true;
	reset_lists();
	if (wake)
		pgjq_shmem_wake_worker();
}

/* At abort: the targets this transaction added go again. */
static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			committed = true;	/* resource_callback does the rest */
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (waiting.n > 0)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has enqueued jobs with dependencies"),
						 errdetail("pgjq tells its worker about them at commit, which two-phase commit does not support.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			committed = false;
			if (dshared != NULL && added.n > 0)
			{
				LWLockAcquire(dshared->lock, LW_EXCLUSIVE);
				for (int i = 0; i + 1 < added.n; i += 2)
					target_release(added.v[i], added.v[i + 1]);
				LWLockRelease(dshared->lock);
			}
			/* the worker: the events it took are lost, look at everything */
			if (full_pending || events_taken)
				need_full = true;
			reset_lists();
			break;
		default:
			break;
	}
}

static void
register_callback(void)
{
	if (!callback_registered)
	{
		RegisterXactCallback(xact_callback, NULL);
		RegisterResourceReleaseCallback(resource_callback, NULL);
		callback_registered = true;
	}
}

/*
 * This transaction finishes job `id` (0: jobs it cannot name), as `how`.
 * Always kept, whether anything depends on the job or not: an enqueue that
 * names it may add it to the set before this transaction commits.  The event
 * carries `how`, so the worker need not look the job up.
 */
void
pgjq_deps_note_finished(int64 id, char how)
{
	if (dshared == NULL)
		return;
	register_callback();
	if (id == 0)
		finished_all = true;
	else
	{
		list_add(&finished, id);
		list_add(&finished, (int64) how);
	}
}

/* ------------------------------------------------------------- enqueue */

/* on_dependency_failure: 'c' (cancel, the default) or 'r' (run) */
char
pgjq_deps_failure_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *v;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 'c';
	v = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (strcmp(v, "cancel") == 0)
		return 'c';
	if (strcmp(v, "run") == 0)
		return 'r';
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("on_dependency_failure must be 'cancel' or 'run'")));
	return 'c';
}

static PgjqPlan plan_missing = {
	"SELECT u.x FROM pg_catalog.unnest($1::int8[]) AS u(x)"
	" WHERE NOT EXISTS (SELECT 1 FROM pgjq.job(u.x)) LIMIT 1",
	1, {INT8ARRAYOID}, NULL, true
};

static PgjqPlan plan_insert_waiting = {
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	" max_attempts, token, enqueued_at, run_at, cancel_requested, payload, timeout,"
	" deps_left, on_dep_failure)"
	" SELECT t.id, $1, 'w', $2, COALESCE(t.fair_key, ''), NULL, 0, $3, 0, $4, $5, false,"
	"        t.payload, $6, t.n, $7"
	"   FROM unnest($8::int8[], $9::jsonb[], $10::text[], $11::int4[])"
	"        AS t(id, payload, fair_key, n)",
	11, {INT4OID, INT2OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INTERVALOID, CHAROID,
	INT8ARRAYOID, JSONBARRAYOID, TEXTARRAYOID, INT4ARRAYOID}
};

static PgjqPlan plan_insert_edges = {
	"INSERT INTO pgjq.job_dependency (depends_on, job_id)"
	" SELECT * FROM unnest($1::int8[], $2::int8[])",
	2, {INT8ARRAYOID, INT8ARRAYOID}, NULL, true
};

static ArrayType *
int8_array(int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return construct_array(d, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

static int
cmp_int64(const void *a, const void *b)
{
	int64		x = *(const int64 *) a;
	int64		y = *(const int64 *) b;

	return x < y ? -1 : x > y;
}

/* sort and drop duplicates in place; returns the new count */
static int
sort_unique(int64 *v, int n)
{
	int			k = 0;

	if (n == 0)
		return 0;
	qsort(v, n, sizeof(int64), cmp_int64);
	for (int i = 1; i < n; i++)
		if (v[i] != v[k])
			v[++k] = v[i];
	return k + 1;
}

/*
 * Add `edges` edges naming each of targets[0..n) to the set, all or none
 * (53400 with a hint when the set is full); remembered so that an abort
 * takes them out again.
 */
static void
targets_add(int64 *targets, int64 *edges, int n)
{
	int			done = 0;
	bool		full = false;

	if (dshared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq must be loaded through shared_preload_libraries"),
				 errhint("Add pgjq to shared_preload_libraries in postgresql.conf and restart the server.")));
	register_callback();
	LWLockAcquire(dshared->lock, LW_EXCLUSIVE);
	for (; done < n; done++)
	{
		DepKey		key = {MyDatabaseId, targets[done]};
		bool		found;
		DepTarget  *t = hash_search(dtargets, &key, HASH_ENTER_NULL, &found);

		if (t == NULL)
		{
			full = true;
			break;
		}
		if (!found)
		{
			t->edges = 0;
			pg_atomic_fetch_add_u32(&dshared->ntargets, 1);
		}
		t->edges += edges[done];
	}
	if (full)
		for (int i = 0; i < done; i++)
			target_release(targets[i], edges[i]);
	LWLockRelease(dshared->lock);
	if (full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("too many jobs have dependents waiting on them"),
				 errdetail("pgjq.max_dependency_targets (%d) jobs are named by waiting jobs already.",
						   pgjq_max_dependency_targets),
				 errhint("Raise pgjq.max_dependency_targets (a restart is needed), or enqueue fewer dependent jobs at once.")));
	for (int i = 0; i < n; i++)
	{
		list_add(&added, targets[i]);
		list_add(&added, edges[i]);
	}
}

/*
 * Store the jobs of one enqueue call of which some have dependencies: those
 * without go the usual way (store), the others wait in pgjq.job.  ids are
 * drawn here, in input order.  Caller is inside pgjq_storage_begin().
 */
void
pgjq_deps_enqueue(const PgjqQueue *queue, PgjqNewJobs *jobs, PgjqJobDeps *deps,
				  char on_failure, PgjqStoreJobs store)
{
	int			n = jobs->n;
	int64	   *named;
	int			nnamed = 0;
	int64	   *edge_from;		/* depends_on */
	int64	   *edge_to;		/* job_id */
	int			nedges = 0;
	int			maxedges = 1;
	int			nfree = 0,
				nwait = 0;

	/* room for every reference, by id or by position (the edges below too) */
	for (int i = 0; i < n; i++)
		maxedges += deps[i].n_ids + deps[i].n_positions;

	/* every job named by id exists (job(id) has a row for it) */
	named = palloc(sizeof(int64) * maxedges);
	for (int i = 0; i < n; i++)
		for (int k = 0; k < deps[i].n_ids; k++)
			named[nnamed++] = deps[i].ids[k];
	nnamed = sort_unique(named, nnamed);
	if (nnamed > 0)
	{
		Datum		v[1] = {PointerGetDatum(int8_array(named, nnamed))};

		/* job(id) looks again itself if a job left shared memory meanwhile */
		pgjq_spi_run(&plan_missing, v, NULL, 1);
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("after names job " INT64_FORMAT ", which does not exist",
							pgjq_spi_get_int64(0, 1)),
					 errdetail("A dependency must be a job whose enqueue has committed, or one that comes earlier in the same call.")));
	}

	for (int i = 0; i < n; i++)
		jobs->ids[i] = pgjq_storage_next_job_id();

	/* the edges, without duplicates per job */
	edge_from = palloc(sizeof(int64) * maxedges);
	edge_to = palloc(sizeof(int64) * maxedges);
	for (int i = 0; i < n; i++)
	{
		int			first = nedges;

		deps[i].n = 0;
		if (deps[i].n_ids + deps[i].n_positions == 0)
			continue;
		for (int k = 0; k < deps[i].n_ids; k++)
			edge_from[nedges++] = deps[i].ids[k];
		for (int k = 0; k < deps[i].n_positions; k++)
			edge_from[nedges++] = jobs->ids[deps[i].positions[k]];
		nedges = first + sort_unique(edge_from + first, nedges - first);
		for (int k = first; k < nedges; k++)
			edge_to[k] = jobs->ids[i];
		deps[i].n = nedges - first;
	}

	/* jobs without dependencies: as any enqueue (into the ring when due) */
	{
		PgjqNewJobs free_jobs = *jobs;
		int64	   *fids = palloc(sizeof(int64) * n);
		Datum	   *fpay = palloc(sizeof(Datum) * n);
		Datum	   *ffk = palloc(sizeof(Datum) * n);
		bool	   *ffkn = palloc(sizeof(bool) * n);

		for (int i = 0; i < n; i++)
			if (deps[i].n == 0)
			{
				fids[nfree] = jobs->ids[i];
				fpay[nfree] = jobs->payloads[i];
				ffkn[nfree] = jobs->fair_keys == NULL || jobs->fair_key_nulls[i];
				ffk[nfree] = ffkn[nfree] ? (Datum) 0 : jobs->fair_keys[i];
				nfree++;
			}
		if (nfree > 0)
		{
			free_jobs.n = nfree;
			free_jobs.ids = fids;
			free_jobs.payloads = fpay;
			free_jobs.fair_keys = ffk;
			free_jobs.fair_key_nulls = ffkn;
			free_jobs.dedup_keys = NULL;
			free_jobs.dedup_key_nulls = NULL;
			free_jobs.ids_given = true;
			free_jobs.created = NULL;
			store(queue, &free_jobs);
		}
	}

	/* the waiting ones, their edges, and their targets in the set */
	if (nedges > 0)
	{
		Datum	   *wid = palloc(sizeof(Datum) * n);
		Datum	   *wpay = palloc(sizeof(Datum) * n);
		Datum	   *wfk = palloc(sizeof(Datum) * n);
		bool	   *wfkn = palloc(sizeof(bool) * n);
		Datum	   *wn = palloc(sizeof(Datum) * n);
		Datum	   *ef = palloc(sizeof(Datum) * nedges);
		Datum	   *et = palloc(sizeof(Datum) * nedges);
		Datum		values[11];
		char		nulls[12] = "           ";
		int64	   *targets = palloc(sizeof(int64) * nedges);
		int64	   *counts = palloc(sizeof(int64) * nedges);
		int			ntargets = 0;
		int			dims[1];
		int			lbs[1] = {1};

		for (int i = 0; i < n; i++)
			if (deps[i].n > 0)
			{
				wid[nwait] = Int64GetDatum(jobs->ids[i]);
				wpay[nwait] = jobs->payloads[i];
				wfkn[nwait] = jobs->fair_keys == NULL || jobs->fair_key_nulls[i];
				wfk[nwait] = wfkn[nwait] ? (Datum) 0 : jobs->fair_keys[i];
				wn[nwait] = Int32GetDatum(deps[i].n);
				nwait++;
			}
		for (int k = 0; k < nedges; k++)
		{
			ef[k] = Int64GetDatum(edge_from[k]);
			et[k] = Int64GetDatum(edge_to[k]);
			targets[k] = edge_from[k];
		}
		/* each target with how many edges name it */
		qsort(targets, nedges, sizeof(int64), cmp_int64);
		for (int k = 0; k < nedges; k++)
		{
			if (ntargets > 0 && targets[ntargets - 1] == targets[k])
				counts[ntargets - 1]++;
			else
			{
				targets[ntargets] = targets[k];
				counts[ntargets++] = 1;
			}
		}
		targets_add(targets, counts, ntargets);

		dims[0] = nwait;
		values[0] = Int32GetDatum(queue->queue_id);
		values[1] = Int16GetDatum(jobs->priority);
		values[2] = Int32GetDatum(jobs->max_attempts);
		values[3] = TimestampTzGetDatum(jobs->enqueued_at);
		values[4] = TimestampTzGetDatum(Max(jobs->run_at, jobs->enqueued_at));
		if (jobs->timeout_us > 0)
			values[5] = pgjq_interval_datum(jobs->timeout_us);
		else
			nulls[5] = 'n';
		values[6] = CharGetDatum('r');
		if (on_failure != 'r')
			nulls[6] = 'n';
		values[7] = PointerGetDatum(construct_array(wid, nwait, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[8] = PointerGetDatum(construct_array(wpay, nwait, JSONBOID, -1, false, TYPALIGN_INT));
		values[9] = PointerGetDatum(construct_md_array(wfk, wfkn, 1, dims, lbs, TEXTOID, -1, false, TYPALIGN_INT));
		values[10] = PointerGetDatum(construct_array(wn, nwait, INT4OID, 4, true, TYPALIGN_INT));
		pgjq_spi_run(&plan_insert_waiting, values, nulls, 0);

		values[0] = PointerGetDatum(construct_array(ef, nedges, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[1] = PointerGetDatum(construct_array(et, nedges, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		pgjq_spi_run(&plan_insert_edges, values, NULL, 0);

		for (int i = 0; i < nwait; i++)
			list_add(&waiting, DatumGetInt64(wid[i]));
	}
}

/* -------------------------------------------------------------- worker */

static PgjqPlan plan_all_targets = {
	"SELECT depends_on, pg_catalog.count(*) FROM pgjq.job_dependency GROUP BY 1",
	0, {0}
};

static PgjqPlan plan_deps_of = {
	"SELECT DISTINCT depends_on FROM pgjq.job_dependency WHERE job_id = ANY ($1::int8[])",
	1, {INT8ARRAYOID}
};

/*
 * Which of the jobs $1 (ids between $2 and $3) have finished, and how: 'c'
 * completed (pgjq.job_done, by its id range), 'd' dead or 'x' cancelled
 * (pgjq.job_history).  Set-based: a fan-in of 10,000 is one statement.
 */
static PgjqPlan plan_finished = {
	"WITH x AS (SELECT DISTINCT id FROM pg_catalog.unnest($1::int8[]) AS x(id))"
	" SELECT x.id, 'c'::\"char\" FROM x"
	"   JOIN (SELECT u.id FROM pgjq.job_done d CROSS JOIN LATERAL pg_catalog.unnest(d.ids) AS u(id)"
	"          WHERE d.max_id >= $2 AND d.min_id <= $3) c ON c.id = x.id"
	" UNION ALL"
	" SELECT h.id, h.state FROM pgjq.job_history h JOIN x ON x.id = h.id",
	3, {INT8ARRAYOID, INT8OID, INT8OID}
};

static PgjqPlan plan_states = {
	"SELECT u.x, j.state FROM pg_catalog.unnest($1::int8[]) AS u(x)"
	"  LEFT JOIN LATERAL pgjq.job(u.x) AS j ON true",
	1, {INT8ARRAYOID}, NULL, true
};

/* the open edges of finished targets, closed; sorted by dependent */
static PgjqPlan plan_close_edges = {
	"WITH f AS (SELECT * FROM unnest($1::int8[], $2::\"char\"[]) AS f(x, s)),"
	"     e AS (DELETE FROM pgjq.job_dependency d USING f WHERE d.depends_on = f.x"
	"           RETURNING d.job_id, d.depends_on, f.s)"
	" SELECT job_id, depends_on, s FROM e ORDER BY job_id, depends_on",
	2, {INT8ARRAYOID, CHARARRAYOID}
};

static PgjqPlan plan_waiting_row = {
	"SELECT deps_left, on_dep_failure, run_at <= $2 FROM pgjq.job WHERE id = $1 AND state = 'w' FOR UPDATE",
	2, {INT8OID, TIMESTAMPTZOID}, NULL, true
};

static PgjqPlan plan_deps_left = {
	"UPDATE pgjq.job SET deps_left = $2 WHERE id = $1",
	2, {INT8OID, INT4OID}, NULL, true
};

static PgjqPlan plan_release = {
	"UPDATE pgjq.job SET state = CASE WHEN run_at <= $2 THEN 'r' ELSE 's' END,"
	"       deps_left = NULL, on_dep_failure = NULL"
	" WHERE id = $1 AND state = 'w' RETURNING state, queue_id, run_at",
	2, {INT8OID, TIMESTAMPTZOID}, NULL, true
};

/* The worker's events of this database, up to `max`; others stay queued. */
static int
take_events(DepEvent *out, int max, bool *all)
{
	int			n = 0;
	int			keep = 0;

	LWLockAcquire(dshared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < dshared->nevents; i++)
	{
		DepEvent   *e = &dshared->events[i];

		if (e->dboid == MyDatabaseId && n < max)
		{
			if (e->kind == EV_ALL)
				*all = true;
			else
				out[n++] = *e;
		}
		else
			dshared->events[keep++] = *e;
	}
	dshared->nevents = keep;
	LWLockRelease(dshared->lock);
	return n;
}

/* A waiting job whose dependencies are done becomes ready, or scheduled. */
static void
release(int64 job, TimestampTz now)
{
	Datum		jv[2] = {Int64GetDatum(job), TimestampTzGetDatum(now)};
	bool		isnull;

	pgjq_spi_run(&plan_release, jv, NULL, 1);
	if (SPI_processed == 0)
		return;
	if (DatumGetChar(pgjq_spi_get(0, 1, &isnull)) == 'r')
	{
		if (pgjq_became_ready_hook)
			pgjq_became_ready_hook(DatumGetInt32(pgjq_spi_get(0, 2, &isnull)), 1);
	}
	else
		pgjq_shmem_note_due(DatumGetTimestampTz(pgjq_spi_get(0, 3, &isnull)));
}

static const char *
ended_as(char s)
{
	return s == 'd' ? "dead" : s == 'x' ? "cancelled" : "missing";
}

/*
 * Close the edges of the finished targets among xs[0..n) and act on their
 * dependents: release, cancel, or count down.  Returns how many targets had
 * finished.
 */
static int
close_finished(int64 *xs, int n, const int64 *kx, const char *ks, int nk,
			   bool look_for_gone, TimestampTz now)
{
	Datum		v[3];
	Datum	   *fx = palloc(sizeof(Datum) * Max(n + nk, 1));
	Datum	   *fs = palloc(sizeof(Datum) * Max(n + nk, 1));
	int			nf = 0;
	int			nlooked;
	SPITupleTable *tt;
	uint64		rows;
	uint64		r = 0;
	int64	   *due;
	int			ndue = 0;

	/* finished as their events said: nothing to look up */
	for (int i = 0; i < nk; i++)
	{
		fx[nf] = Int64GetDatum(kx[i]);
		fs[nf++] = CharGetDatum(ks[i]);
	}
	nlooked = nf;
	if (n == 0)
		goto close;

	/* xs is sorted: its ends bound the ids */
	v[0] = PointerGetDatum(int8_array(xs, n));
	v[1] = Int64GetDatum(xs[0]);
	v[2] = Int64GetDatum(xs[n - 1]);

	/*
	 * Planned with the values each time (not a generic plan): how many ids
	 * and how wide their range is decide between an index and a hash join
	 */
	if (SPI_execute_with_args(plan_finished.sql, plan_finished.nargs, plan_finished.argtypes,
							  v, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "pgjq: could not look up finished dependencies");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		fx[nf] = Int64GetDatum(pgjq_spi_get_int64(i, 1));
		fs[nf] = pgjq_spi_get(i, 2, &isnull);
		nf++;
	}

	/*
	 * A job with no row anywhere is gone (its queue was dropped).  Looked for
	 * only when a drop happened or after a start (job(id) for each unfinished
	 * target is the costly part), and twice: a job whose completion commits
	 * during the look can be gone from shared memory while the look's
	 * snapshot does not show its history row yet; the second look has a newer
	 * snapshot, taken after shared memory let it go.
	 */
	if (look_for_gone && nf - nlooked < n)
	{
		int64	   *rest = palloc(sizeof(int64) * n);
		int			nrest = 0;
		int64	   *fin = palloc(sizeof(int64) * Max(nf, 1));
		int			nfin = nf;

		for (int i = 0; i < nf; i++)
			fin[i] = DatumGetInt64(fx[i]);
		qsort(fin, nfin, sizeof(int64), cmp_int64);
		for (int i = 0; i < n; i++)
			if (bsearch(&xs[i], fin, nfin, sizeof(int64), cmp_int64) == NULL)
				rest[nrest++] = xs[i];
		for (int pass = 0; pass < 2 && nrest > 0; pass++)
		{
			int			k = 0;

			v[0] = PointerGetDatum(int8_array(rest, nrest));
			pgjq_spi_run(&plan_states, v, NULL, 0);
			for (uint64 i = 0; i < SPI_processed; i++)
			{
				bool		isnull;
				Datum		st = pgjq_spi_get(i, 2, &isnull);

				if (!isnull)
				{
					char	   *state = TextDatumGetCString(st);
					char		c = strcmp(state, "completed") == 0 ? 'c' :
					strcmp(state, "dead") == 0 ? 'd' :
					strcmp(state, "cancelled") == 0 ? 'x' : 0;

					/* finished since the look above: taken now */
					if (c != 0 && pass == 1)
					{
						fx[nf] = Int64GetDatum(pgjq_spi_get_int64(i, 1));
						fs[nf++] = CharGetDatum(c);
					}
					continue;
				}
				if (pass == 0)
					rest[k++] = pgjq_spi_get_int64(i, 1);
				else
				{
					fx[nf] = Int64GetDatum(pgjq_spi_get_int64(i, 1));
					fs[nf++] = CharGetDatum('v');
				}
			}
			if (pass == 0)
				nrest = k;
		}
	}
close:
	if (nf == 0)
		return 0;

	v[0] = PointerGetDatum(construct_array(fx, nf, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	v[1] = PointerGetDatum(construct_array(fs, nf, CHAROID, 1, true, TYPALIGN_CHAR));
	pgjq_spi_run(&plan_close_edges, v, NULL, 0);
	tt = SPI_tuptable;
	rows = SPI_processed;
	/* the set drops the closed edges at commit */
	{
		int64	   *xs2 = palloc(sizeof(int64) * Max(rows, 1));

		for (uint64 i = 0; i < rows; i++)
		{
			bool		isnull;

			xs2[i] = DatumGetInt64(SPI_getbinval(tt->vals[i], tt->tupdesc, 2, &isnull));
		}
		qsort(xs2, rows, sizeof(int64), cmp_int64);
		for (uint64 i = 0; i < rows;)
		{
			uint64		j = i;

			while (j < rows && xs2[j] == xs2[i])
				j++;
			list_add(&closed, xs2[i]);
			list_add(&closed, (int64) (j - i));
			i = j;
		}
	}

	/* one dependent at a time: its closed edges are consecutive rows */
	due = palloc(sizeof(int64) * Max(rows, 1));
	while (r < rows)
	{
		bool		isnull;
		int64		job = DatumGetInt64(SPI_getbinval(tt->vals[r], tt->tupdesc, 1, &isnull));
		int			nclosed = 0;
		int64		bad = 0;
		char		bad_s = 0;
		Datum		jv[2];
		int32		left;
		bool		run_anyway;
		bool		due_now;

		for (; r < rows && DatumGetInt64(SPI_getbinval(tt->vals[r], tt->tupdesc, 1, &isnull)) == job; r++)
		{
			char		s = DatumGetChar(SPI_getbinval(tt->vals[r], tt->tupdesc, 3, &isnull));

			nclosed++;
			if (s != 'c' && bad == 0)
			{
				bad = DatumGetInt64(SPI_getbinval(tt->vals[r], tt->tupdesc, 2, &isnull));
				bad_s = s;
			}
		}
		jv[0] = Int64GetDatum(job);
		jv[1] = TimestampTzGetDatum(now);
		pgjq_spi_run(&plan_waiting_row, jv, NULL, 1);
		if (SPI_processed == 0)
			continue;			/* cancelled meanwhile, or its queue dropped */
		left = DatumGetInt32(pgjq_spi_get(0, 1, &isnull));
		(void) pgjq_spi_get(0, 2, &run_anyway);
		run_anyway = !run_anyway;	/* on_dep_failure is 'r' or NULL */
		due_now = DatumGetBool(pgjq_spi_get(0, 3, &isnull));
		if (bad != 0 && !run_anyway)
		{
			char	   *reason = psprintf("dependency " INT64_FORMAT " ended %s", bad, ended_as(bad_s));

			(void) pgjq_storage_cancel_waiting(job, reason, now);
		}
		else if (left - nclosed <= 0 && due_now)
			due[ndue++] = job;	/* into the ring below, all at once */
		else if (left - nclosed <= 0)
			release(job, now);	/* scheduled: it has a run_at ahead */
		else
		{
			jv[1] = Int32GetDatum(left - nclosed);
			pgjq_spi_run(&plan_deps_left, jv, NULL, 0);
		}
	}

	/*
	 * The released jobs due now go into the ring in this transaction, so a
	 * claim pops them from a lane (its commit wakes waiting claims); any the
	 * ring has no room for become ready rows, which claims move later.
	 */
	if (ndue > 0)
	{
		(void) pgjq_ring_promote_waiting(ndue, due);
		for (int i = 0; i < ndue; i++)
			release(due[i], now);	/* a no-op for those now in the ring */
	}
	return nf;
}

/*
 * One chunk of the worker's work on dependencies, in the caller's
 * transaction: the queued events of this database (up to
 * PGJQ_MAINTENANCE_CHUNK), or every open edge on the first call and after
 * lost events.  Returns how many events and targets it looked at.
 */
int64
pgjq_deps_resolve_chunk(void)
{
	DepEvent   *ev;
	int			nev;
	bool		full;
	bool		look_for_gone;
	bool		all = false;
	uint64		overflows;
	int64	   *xs;
	int			nx = 0;
	int			maxx;
	int64	   *checks;
	int			nchecks = 0;
	int64	   *kx;				/* finished, as their events said */
	char	   *ks;
	int			nk = 0;
	int			nfin = 0;
	TimestampTz now = GetCurrentTimestamp();

	if (dshared == NULL)
		return 0;
	register_callback();

	/*
	 * The worker's chunk need not wait for its WAL flush: if a crash loses
	 * it, the first look after the restart does it again (the edges and the
	 * finished dependencies are still there), and a claim of a released job
	 * flushes this chunk's WAL with its own commit, which comes after it. One
	 * flush fewer between a completion and its dependent's pickup. (Local to
	 * the chunk's transaction, like SET LOCAL.)
	 */
	if (PGJQ_IN_BGWORKER)
	{
		(void) set_config_option("synchronous_commit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);

		/*
		 * a full look's estimates can pass jit_above_cost: compiling costs
		 * more
		 */
		(void) set_config_option("jit", "off", PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_LOCAL, true, 0, false);
	}
	overflows = pg_atomic_read_u64(&dshared->overflows);
	ev = palloc(sizeof(DepEvent) * PGJQ_MAINTENANCE_CHUNK);
	nev = take_events(ev, PGJQ_MAINTENANCE_CHUNK, &all);
	full = need_full || all || overflows != seen_overflows;

	/*
	 * And at least every pgjq.max_sleep while jobs wait: whatever an event
	 * missed, a release is late by at most that much, never lost.
	 */
	if (!full && pg_atomic_read_u32(&dshared->ntargets) > 0 &&
		now - last_full >= (int64) pgjq_max_sleep_ms * 1000)
		full = true;
	if (full)
		last_full = now;
	/* a drop, and the first look after a start: targets that are gone */
	look_for_gone = all || !gone_looked;
	if (all)
		gone_looked = false;	/* until this look commits */
	gone_pending = look_for_gone;
	/* an abort loses the events taken: the next chunk looks at everything */
	events_taken = nev > 0;
	if (full)
	{
		seen_overflows = overflows;
		full_pending = true;
	}

	maxx = nev + 16;
	xs = palloc(sizeof(int64) * maxx);
	checks = palloc(sizeof(int64) * Max(nev, 1));
	kx = palloc(sizeof(int64) * Max(nev, 1));
	ks = palloc(sizeof(char) * Max(nev, 1));
	for (int i = 0; i < nev; i++)
	{
		if (ev[i].kind == EV_FINISHED && ev[i].how != 0)
		{
			kx[nk] = ev[i].id;
			ks[nk++] = ev[i].how;
		}
		else if (ev[i].kind == EV_FINISHED)
			xs[nx++] = ev[i].id;
		else
			checks[nchecks++] = ev[i].id;
	}

	pgjq_storage_begin();
	if (full)
	{
		/* every target back into the set, and each looked at */
		pgjq_spi_run(&plan_all_targets, NULL, NULL, 0);
		if (SPI_processed > 0)
		{
			uint64		rows = SPI_processed;
			int64	   *t = palloc(sizeof(int64) * rows);
			int64	   *c = palloc(sizeof(int64) * rows);

			for (uint64 i = 0; i < rows; i++)
			{
				t[i] = pgjq_spi_get_int64(i, 1);
				c[i] = pgjq_spi_get_int64(i, 2);
			}
			LWLockAcquire(dshared->lock, LW_EXCLUSIVE);
			for (uint64 i = 0; i < rows; i++)
			{
				DepKey		key = {MyDatabaseId, t[i]};
				bool		found;
				DepTarget  *e = hash_search(dtargets, &key, HASH_ENTER_NULL, &found);

				if (e == NULL)
					break;		/* full: enqueues say so; these are looked at
								 * below */
				if (!found)
				{
					e->edges = 0;
					pg_atomic_fetch_add_u32(&dshared->ntargets, 1);
				}
				e->edges = Max(e->edges, c[i]);
			}
			LWLockRelease(dshared->lock);
			xs = repalloc(xs, sizeof(int64) * (maxx + rows));
			for (uint64 i = 0; i < rows; i++)
				xs[nx++] = t[i];
		}
	}
	if (nchecks > 0)
	{
		Datum		v[1] = {PointerGetDatum(int8_array(checks, nchecks))};

		pgjq_spi_run(&plan_deps_of, v, NULL, 0);
		xs = repalloc(xs, sizeof(int64) * (nx + SPI_processed + 1));
		for (uint64 i = 0; i < SPI_processed; i++)
			xs[nx++] = pgjq_spi_get_int64(i, 1);
	}
	nx = sort_unique(xs, nx);
	/* the jobs whose events said how they ended need no look */
	if (nk > 0 && nx > 0)
	{
		int64	   *sk = palloc(sizeof(int64) * nk);
		int			m = 0;

		memcpy(sk, kx, sizeof(int64) * nk);
		qsort(sk, nk, sizeof(int64), cmp_int64);
		for (int i = 0; i < nx; i++)
			if (bsearch(&xs[i], sk, nk, sizeof(int64), cmp_int64) == NULL)
				xs[m++] = xs[i];
		nx = m;
	}
	if (nx > 0 || nk > 0)
		nfin = close_finished(xs, nx, kx, ks, nk, look_for_gone, now);
	pgjq_storage_end();
	if (GetCurrentTimestamp() - now > 500 * 1000)
		elog(LOG, "pgjq: dependencies: a chunk took %ld ms (%d events, %s look, %d targets, %d finished, gone %d)",
			 (long) ((GetCurrentTimestamp() - now) / 1000), nev, full ? "full" : "event", nx, nfin, look_for_gone);
	return nev + (full ? nx : 0);
}

/* Everything there is to do now, in the caller's transaction (pgjq.promote()). */
int64
pgjq_deps_resolve_all(void)
{
	int64		total = 0;
	int64		n;

	do
	{
		CHECK_FOR_INTERRUPTS();
		n = pgjq_deps_resolve_chunk();
		total += n;
	} while (n >= PGJQ_MAINTENANCE_CHUNK && dshared->nevents > 0);
	return total;
}
