/*-------------------------------------------------------------------------
 *
 * ring_read.c
 *	  The ring's answers to job(id) (pgjq._ring_job), the queue
 *	  counts (pgjq._ring_counts, queue_stats, metrics) and limits.c's count
 *	  of running jobs per key: from shared memory, read under the ring's
 *	  LWLock in shared mode, or from the tables (ring_standby.c) on a standby
 *	  and to a REPEATABLE READ or SERIALIZABLE transaction.
 *
 * job(id) reads the newest body first (no ring lock held), then looks for
 * the job in the in-flight table and its lane; a job found in neither whose
 * mover has committed but not yet published it is waited for (its xid lock)
 * and looked up again.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring_store_internal.h"
#include "common/crash_points.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/inval.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "storage/proc.h"
#include "storage/procarray.h"

/* lock held: the enqueue time of the queue's oldest ready job, 0 if none */
static TimestampTz
oldest_ready(RingQueue *q)
{
	TimestampTz oldest = 0;

	/* the head of each lane is its oldest job; linked lanes have one */
	for (RingPrio *r = q->prios; r != NULL; r = r->next)
	{
		RingLane   *h = r->head;
		RingLane   *l = h;

		while (l != NULL)
		{
			TimestampTz t = ring->nodes[l->head].p.enqueued_at;

			if (oldest == 0 || t < oldest)
				oldest = t;
			l = l->next;
			if (l == h)
				break;
		}
	}
	return oldest;
}

/*
 * Lock held: the queue's ready and running ring jobs as committed, as this
 * transaction sees them (as a query of pgjq.job would): another
 * transaction's claim not committed yet leaves its jobs ready (or unseen,
 * if that transaction enqueued them), this transaction's own claims count
 * as running.
 */
static void
committed_counts(RingQueue *q, int64 *ready, int64 *running)
{
	int64		mine = 0,
				mine_own = 0;

	if (q->claiming > 0)
		ring_own_claiming(q->key.queue_id, &mine, &mine_own);
	*ready = q->ready + (q->claiming - mine) - (q->claiming_own - mine_own);
	*running = q->running - q->claiming + mine;
}

void
pgjq_ring_counts(int32 queue_id, bool committed, int64 *ready, int64 *running,
				 TimestampTz *oldest)
{
	RingQueue  *q;

	*ready = *running = 0;
	*oldest = 0;
	if (ring == NULL || !ring_ensure_ready(false) || (committed && IsolationUsesXactSnapshot()))
	{
		/*
		 * a hot standby (or no preload) keeps no ring state: the tables say
		 * it (ring_read_snapshot)
		 */
		(void) ring_standby_counts(queue_id, ready, running, oldest);
		return;
	}
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	if (q != NULL && committed)
	{
		committed_counts(q, ready, running);
		*oldest = oldest_ready(q);
	}
	else if (q != NULL)
	{
		*ready = q->ready;
		*running = q->running;
		*oldest = oldest_ready(q);
	}
	LWLockRelease(ring->lock);
}

/* ---------------------------------------------------------------------
 * SQL: pgjq._ring_job(id) for job(), pgjq._ring_counts() for queue_stats
 * --------------------------------------------------------------------- */
PG_FUNCTION_INFO_V1(pgjq_ring_job);
PG_FUNCTION_INFO_V1(pgjq_ring_counts_sql);

/*
 * The ring's view of a job: ready (in a lane) or running (in flight), as a
 * pgjq.job_info row; nothing when the ring does not hold it unfinished (a
 * finished ring job is in pgjq.job_done, a moved one in pgjq.job).
 */
/* job(id) looking again (below): its inner _ring_job call does not */
static bool second_look = false;

/*
 * The job's body is in this statement's snapshot, but the job is no longer
 * in shared memory: its outcome (complete, fail, cancel) committed after the
 * snapshot was taken, and the rows that say what it became (job_done,
 * job_history, pgjq.job), which job() reads before asking here, are not in
 * that snapshot.  Without a second look job(id) would say "no such job" for
 * an instant: wait_jobs() reported it as unknown, enqueue(after) refused it.
 * job() again with the latest snapshot shows those rows (pgjq's commit
 * callbacks run after the commit is visible); a job of a dropped queue has
 * none, and stays unknown.
 */
static void
look_again(int64 id, ReturnSetInfo *rsinfo)
{
	static PgjqPlan plan_job = {"SELECT * FROM pgjq.job($1)", 1, {INT8OID}};
	Datum		v[1] = {Int64GetDatum(id)};

	/*
	 * The outcome may have created the hour's partition of pgjq.job_done.
	 * This statement holds job_done's lock already, so nothing below takes a
	 * lock that would read the catalog changes other backends sent: read them
	 * now, or the second look plans (or, on PostgreSQL 18, reuses the SQL
	 * function's cached plan) without that partition and misses the row.
	 */
	AcceptInvalidationMessages();
	second_look = true;
	PG_TRY();
	{
		pgjq_spi_run_latest(&plan_job, v, NULL, 1);
	}
	PG_FINALLY();
	{
		second_look = false;
	}
	PG_END_TRY();
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		Datum		values[18];
		bool		nulls[18];

		for (int c = 0; c < 18; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, c + 1,
									  &nulls[c]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
}

Datum
pgjq_ring_job(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	BodyRow		b;
	int			slot;
	ItemPointerData tid;
	RingLaneKey key;
	bool		ready = false,
				running = false;
	TimestampTz lease = 0;
	Datum		values[18];		/* pgjq.job_info; result (16) and waiting_for
								 * (17) stay NULL */
	bool		nulls[18];
	char	   *qname = NULL;
	char	   *worker = NULL;
	bool		cancel = false;
	bool		live;
	bool		left = false;

	InitMaterializedSRF(fcinfo, 0);
	live = ring != NULL && ring_ensure_ready(false);
	pgjq_storage_begin();
	if (!live || IsolationUsesXactSnapshot())
	{
		/*
		 * a hot standby (or a server without the preload): the tables say it;
		 * and to a REPEATABLE READ or SERIALIZABLE transaction, as of its
		 * snapshot (ring_read_snapshot)
		 */
		char		st;

		if (ring_standby_job(id, &st, &lease, &worker, &cancel, &b))
		{
			ready = st == 'r';
			running = st == 'a';
		}
	}
	else if (ring_body_by_id(id, &b, &slot, &tid, true))
	{
		RingFlight *f;
		int64		ctoken = 0;
		int			cslot = RING_NO_SLOT;
		ItemPointerData ctid;
		bool		waited = false;

		ring_body_lane_key(&b, &key);
		/* tests: the window between the snapshot's read and shared memory */
		pgjq_crash_point("ring_job_live");
again:
		LWLockAcquire(ring->lock, LW_SHARED);
		f = ring_flight_find(id);
		/* a claim shows as running once committed, and to its own transaction */
		if (f != NULL && (f->state != RF_CLAIMING || f->xid == GetTopTransactionIdIfAny()))
		{
			running = true;
			lease = f->lease_until;
			/* as committed, and to the transaction that requested it */
			cancel = f->cancel_requested ||
				(f->state == RF_EXTENDING && f->xid == GetTopTransactionIdIfAny() &&
				 ring_cancel_requested_here(id));
			ctoken = f->token;
			cslot = f->claim_slot;
			ctid = f->claim_tid;
		}
		else
		{
			RingLane   *l = hash_search(ring_lanes, &key, HASH_FIND, NULL);

			/* a job being claimed counts as ready until its claim commits */
			if (f != NULL)
				ready = true;
			for (int32 n = l ? l->head : -1; n >= 0 && !ready; n = ring->nodes[n].next)
				if (ring->nodes[n].p.id == id)
					ready = true;
		}
		LWLockRelease(ring->lock);

		/*
		 * Neither: finished, or its mover (enqueue, promotion) has committed
		 * and its commit callback has not published it yet.  That callback
		 * runs before the mover's xid lock goes: wait for it, look again.
		 */
		if (!ready && !running && !waited && TransactionIdIsNormal(b.xmin) &&
			!TransactionIdIsCurrentTransactionId(b.xmin))
		{
			XactLockTableWait(b.xmin, NULL, NULL, XLTW_None);
			waited = true;
			goto again;
		}
		/* the claim row names the worker (it is read without the ring's lock) */
		if (running)
			worker = ring_claim_worker(cslot, &ctid, ctoken);
		left = !ready && !running;
	}
	if (ready || running)
	{
		Datum		qv[1] = {Int32GetDatum(b.queue_id)};
		static PgjqPlan plan_qname = {
			"SELECT name FROM pgjq.queue WHERE queue_id = $1", 1, {INT4OID}
		};
		bool		isnull;

		pgjq_spi_run(&plan_qname, qv, NULL, 1);
		if (SPI_processed == 1)
			qname = MemoryContextStrdup(pgjq_result_cxt,
										TextDatumGetCString(pgjq_spi_get(0, 1, &isnull)));
	}
	if (ready || running)
	{
		MemoryContext old = MemoryContextSwitchTo(pgjq_result_cxt);

		memset(nulls, true, sizeof(nulls));
		values[0] = Int64GetDatum(id);
		nulls[0] = false;
		if (qname)
		{
			values[1] = CStringGetTextDatum(qname);
			nulls[1] = false;
		}
		values[2] = CStringGetTextDatum(running ? "running" : "ready");
		nulls[2] = false;

		/*
		 * attempts made so far, as pgjq.job counts them: a ready job has not
		 * run this one
		 */
		values[3] = Int32GetDatum(running ? b.attempt : b.attempt - 1);
		nulls[3] = false;
		values[4] = Int32GetDatum(b.max_attempts);
		nulls[4] = false;
		values[5] = Int16GetDatum(b.priority);
		nulls[5] = false;
		if (b.fair_key)
		{
			values[6] = datumCopy(b.fair_key, false, -1);
			nulls[6] = false;
		}
		if (b.dedup_key)
		{
			values[7] = datumCopy(b.dedup_key, false, -1);
			nulls[7] = false;
		}
		values[8] = datumCopy(b.payload, false, -1);
		nulls[8] = false;
		if (b.last_error)
		{
			values[14] = datumCopy(b.last_error, false, -1);
			nulls[14] = false;
		}
		values[9] = TimestampTzGetDatum(b.enqueued_at);
		nulls[9] = false;
		values[10] = TimestampTzGetDatum(b.run_at ? b.run_at : b.enqueued_at);
		nulls[10] = false;
		if (running)
		{
			values[11] = TimestampTzGetDatum(lease);
			nulls[11] = false;
		}
		if (running && worker)
		{
			values[13] = CStringGetTextDatum(worker);
			nulls[13] = false;
		}
		values[15] = BoolGetDatum(running && cancel);
		nulls[15] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		MemoryContextSwitchTo(old);
	}
	if (left && !second_look)
		look_again(id, rsinfo);
	pgjq_storage_end();
	return (Datum) 0;
}

/* pgjq._ring_counts(): (queue_id, ready, running, oldest_ready) of this database's ring queues */
Datum
pgjq_ring_counts_sql(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS hs;
	RingQueue  *q;
	int			n = 0,
				max;
	Datum	   *rowsv;
	int64		ready,
				running;

	InitMaterializedSRF(fcinfo, 0);
	if (ring == NULL || !ring_ensure_ready(false) || IsolationUsesXactSnapshot())
	{
		/*
		 * a hot standby (or no preload): counted from the tables; as of the
		 * snapshot of a REPEATABLE READ or SERIALIZABLE transaction too
		 */
		HTAB	   *counts = ring_standby_scan();
		StandbyCount *e;

		if (counts == NULL)
			return (Datum) 0;
		hash_seq_init(&hs, counts);
		while ((e = hash_seq_search(&hs)) != NULL)
		{
			Datum		v[4];
			bool		nulls[4] = {false, false, false, e->oldest == 0};

			v[0] = Int32GetDatum(e->queue_id);
			v[1] = Int64GetDatum(e->ready);
			v[2] = Int64GetDatum(e->running);
			v[3] = TimestampTzGetDatum(e->oldest);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
		}
		return (Datum) 0;
	}
	/* room for every queue the table can hold: no allocation under the lock */
	max = pgjq_ring_max_queues;
	rowsv = palloc(sizeof(Datum) * 4 * max);
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_queues);
	while ((q = hash_seq_search(&hs)) != NULL)
	{
		if (q->key.dbid != MyDatabaseId || (q->ready == 0 && q->running == 0) || n >= max)
			continue;
		committed_counts(q, &ready, &running);
		rowsv[4 * n] = Int32GetDatum(q->key.queue_id);
		rowsv[4 * n + 1] = Int64GetDatum(ready);
		rowsv[4 * n + 2] = Int64GetDatum(running);
		rowsv[4 * n + 3] = TimestampTzGetDatum(oldest_ready(q));
		n++;
	}
	LWLockRelease(ring->lock);
	for (int i = 0; i < n; i++)
	{
		bool		nulls[4] = {false, false, false, DatumGetTimestampTz(rowsv[4 * i + 3]) == 0};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &rowsv[4 * i], nulls);
	}
	return (Datum) 0;
}

/*
 * limits.c's count at the first call, of a queue that gets a key limit, and
 * its verify(): the running ring jobs of this database per (queue, key),
 * keys as pgjq_limits_key_hash (arrays in the caller's context; a key may
 * come once per priority, and a queue's count is the sum of its rows).
 * queue_id 0 means every queue.  Rebuilds the ring first if it is not yet.
 */
int
pgjq_ring_running_keys(int32 queue_id, int32 **qids, uint64 **hashes, int64 **counts)
{
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	int			n = 0,
				max;

	*qids = NULL;
	*hashes = NULL;
	*counts = NULL;
	if (ring == NULL || !ring_ensure_ready(false))
		return 0;
	max = pgjq_ring_max_lanes;
	*qids = palloc(sizeof(int32) * max);
	*hashes = palloc(sizeof(uint64) * max);
	*counts = palloc(sizeof(int64) * max);
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
	{
		if (l->key.dbid != MyDatabaseId || l->running == 0 || n >= max ||
			(queue_id != 0 && l->key.queue_id != queue_id))
			continue;
		(*qids)[n] = l->key.queue_id;
		(*hashes)[n] = ring_limits_hash(l->key.keyhash);
		(*counts)[n] = l->running;
		n++;
	}
	LWLockRelease(ring->lock);
	return n;
}
