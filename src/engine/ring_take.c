/*-------------------------------------------------------------------------
 *
 * ring_take.c
 *	  Ready ring jobs taken out of their lanes: cancel of a ready job,
 *	  on_duplicate => 'replace' (debounce) of one, and the jobs of a queue
 *	  that is purged or dropped.
 *
 * A ready job is taken as a claim of this transaction that it closes at once
 * (take_closing, under the ring's LWLock, exclusive): one closing log row
 * ('x' or 'f') makes it finished for a rebuild; its lane position comes back
 * if the transaction rolls back (ring_xact.c).  drop_jobs first waits,
 * without the lock, for open transactions that claim or close jobs of the
 * queue, then takes its ready jobs a thousand at a time.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring_store_internal.h"

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

/*
 * Lock held: the new in-flight entry f takes p out of lane l (already
 * removed from it, or this transaction's own pending job) as a claim of
 * this transaction would, and this transaction closes it at once: cancel's
 * way of moving a ready ring job to pgjq.job.
 */
static void
take_closing(RingFlight *f, RingLane *l, const RingPos *p, int64 tok, int32 attempt,
			 bool pending)
{
	l->running++;
	l->queue->running++;
	f->token = tok;
	f->lease_until = 0;
	f->pending = pending;
	f->enqueued_at = p->enqueued_at;
	f->xid = GetTopTransactionId();
	f->tid = p->tid;
	f->slot = p->slot;
	f->attempt = attempt;
	f->queue_id = l->key.queue_id;
	f->lane = l;
	ring_lane_settle(l);
	if (!pending)
		ring->held++;
	ring_claim_begun(f);
	ring_note_claimed(f->key.id);
	/* and closed by the same transaction */
	ring_note_closed(f->key.id, true, false);
	f->state = RF_CLOSING;
}

/*
 * The ready ring job taken by take_closing ends as cancelled: one 'x' log
 * row closes the claim it was taken with, one history row says so (as a
 * cancelled job of pgjq.job, without its payload).
 */
static void
cancel_ready(const RingFlight *f)
{
	TimestampTz now = GetCurrentTimestamp();
	BodyRow		b;
	char	   *worker;			/* none: the job was never claimed */

	ring_closed_body(f, &b, &worker);
	ring_log_append(f->token, now, 'x', &f->key.id, 1);
	/* the attempts made: the body counts the one about to run */
	ring_history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt - 1, f->token, worker, b.last_error, now);
}

/*
 * take_ready for a job this transaction enqueued and has not published (its
 * body is not visible to this command yet): taken from the pending list as
 * its own claim would, then closed as cancelled.  False if it is not one.
 */
static bool
take_own_ready(int64 id, RingFlight *copy)
{
	RingPos		p;
	RingLane   *l;
	RingFlight *f;
	int64		tok = 0;
	bool		taken = false;

	tok = ring_next_token(&tok);
	ring_reserve_local(0, 1, 1);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	if (ring_take_own_id(id, &p, &l))
	{
		f = ring_flight_enter(id);
		if (f == NULL)
		{
			ring_take_own_undo(&p, 1);
			LWLockRelease(ring->lock);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("pgjq's ring engine has no room for more jobs in flight"),
					 errhint("Raise pgjq.ring_max_in_flight and restart the server.")));
		}
		take_closing(f, l, &p, tok, 1, true);
		*copy = *f;
		taken = true;
	}
	LWLockRelease(ring->lock);
	return taken;
}

/*
 * The ready ring job id out of its lane, as a claim of this transaction that
 * it closes at once (take_closing); *copy is its in-flight entry.  False if
 * it is not a ready ring job (running, finished, or not in the ring).
 */
static bool
take_ready(int64 id, RingFlight *copy)
{
	BodyRow		b;
	int			slot;
	ItemPointerData tid;
	RingLaneKey key;
	RingLane   *l;
	RingFlight *f;
	RingPos		p;
	bool		taken = false;
	int64		tok = 0;

	ring_require_for_jobs(1, &id);
	if (ring == NULL || !ring_ensure_ready(false))
		return false;
	if (ring_writing() && take_own_ready(id, copy))
		return true;			/* this transaction's own enqueue */
	if (!ring_body_by_id(id, &b, &slot, &tid, true))
		return false;
	ring_body_lane_key(&b, &key);
	tok = ring_next_token(&tok);
	ring_reserve_local(0, 1, 1);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	l = hash_search(ring_lanes, &key, HASH_FIND, NULL);
	if (l != NULL && ring_lane_remove(l, id, &p))
	{
		f = ring_flight_enter(id);
		if (f == NULL)
		{
			/* the node went back to the pool: there is room */
			ring_lane_push_front(l, &p);
			LWLockRelease(ring->lock);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("pgjq's ring engine has no room for more jobs in flight"),
					 errhint("Raise pgjq.ring_max_in_flight and restart the server.")));
		}
		take_closing(f, l, &p, tok, b.attempt, false);
		*copy = *f;
		taken = true;
	}
	LWLockRelease(ring->lock);
	return taken;
}

bool
pgjq_ring_take_ready(int64 id)
{
	RingFlight	copy;

	if (!take_ready(id, &copy))
		return false;
	cancel_ready(&copy);
	return true;
}

/* a replaced ready ring job's next version (debounce) in pgjq.job */
static PgjqPlan plan_replace_anchor = {
	"UPDATE pgjq.job SET state = $2, attempt = $3, token = $4, run_at = $5, payload = $6,"
	"                    last_error = $7, timeout = $8"
	" WHERE id = $1 AND state = 'n'",
	8, {INT8OID, CHAROID, INT4OID, INT8OID, TIMESTAMPTZOID, JSONBOID, TEXTOID, INTERVALOID}, NULL, true
};
static PgjqPlan plan_replace_insert = {
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	"                      max_attempts, token, enqueued_at, run_at, last_error,"
	"                      cancel_requested, payload, timeout)"
	" SELECT $1, $9, $2, $10, coalesce($11, ''), NULL, $3, $12, $4, $13, $5, $7, false, $6, $8",
	13, {INT8OID, CHAROID, INT4OID, INT8OID, TIMESTAMPTZOID, JSONBOID, TEXTOID, INTERVALOID,
	INT4OID, INT2OID, TEXTOID, INT4OID, TIMESTAMPTZOID}
};

/*
 * on_duplicate => 'replace' of a ready ring job: out of its lane as cancel
 * takes it (its claim closed by one 'f' log row, as a snooze closes one),
 * and its next version, with the new payload, waits in pgjq.job until
 * run_at: its anchor turned into that row, or (a key held for a period,
 * without an anchor) a new row.  run_at is due, no later than debounce_max
 * after the job's enqueue (0: no bound).  False, and nothing changed, if the
 * job is not a ready ring job.
 */
bool
pgjq_ring_replace_ready(int64 id, Datum payload, TimestampTz due, int64 debounce_max_us,
						TimestampTz now, char *state, TimestampTz *run_at)
{
	RingFlight	f;
	BodyRow		b;
	char	   *worker;
	Datum		values[13];
	char		nulls[14] = "             ";

	if (!take_ready(id, &f))
		return false;
	ring_closed_body(&f, &b, &worker);
	*run_at = due;
	if (debounce_max_us > 0 && b.enqueued_at + debounce_max_us < due)
		*run_at = b.enqueued_at + debounce_max_us;
	*state = *run_at > now ? 's' : 'r';
	ring_log_append(f.token, now, 'f', &id, 1);
	values[0] = Int64GetDatum(id);
	values[1] = CharGetDatum(*state);
	/* pgjq.job counts the attempts made; a body, the one it is for */
	values[2] = Int32GetDatum(b.attempt - 1);
	values[3] = Int64GetDatum(f.token);
	values[4] = TimestampTzGetDatum(*run_at);
	values[5] = payload;
	values[6] = b.last_error;
	nulls[6] = b.last_error ? ' ' : 'n';
	values[7] = b.timeout_us > 0 ? pgjq_interval_datum(b.timeout_us) : (Datum) 0;
	nulls[7] = b.timeout_us > 0 ? ' ' : 'n';
	values[8] = Int32GetDatum(b.queue_id);
	values[9] = Int16GetDatum(b.priority);
	values[10] = b.fair_key;
	nulls[10] = b.fair_key ? ' ' : 'n';
	values[11] = Int32GetDatum(b.max_attempts);
	values[12] = TimestampTzGetDatum(b.enqueued_at);
	pgjq_spi_run(b.dedup_key ? &plan_replace_anchor : &plan_replace_insert, values, nulls, 0);
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the dedup anchor of job " INT64_FORMAT " is missing", id)));
	return true;
}

int64
pgjq_ring_drop_jobs(int32 queue_id, bool drop, bool force, int64 *nready)
{
	bool		running_too = drop && force;
	TransactionId xid;
	int64		running = 0;
	int64	   *rid = NULL;
	int64	   *rtok = NULL;
	int			nrun = 0;
	bool		waited;

	*nready = 0;
	if (ring == NULL || !ring_ensure_ready(false))
		return 0;
	xid = GetTopTransactionId();
	/* the queue's record goes when the drop commits */
	if (drop)
		ring_note_queue_dropped(queue_id);

	/* wait for open transactions that claim or close jobs of the queue */
	do
	{
		HASH_SEQ_STATUS hs;
		RingFlight *f;
		TransactionId other = InvalidTransactionId;

		waited = false;
		running = 0;
		LWLockAcquire(ring->lock, LW_SHARED);
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
		{
			if (f->key.dbid != MyDatabaseId || f->queue_id != queue_id)
				continue;
			if (f->state != RF_OPEN && f->xid != xid)
			{
				other = f->xid;
				hash_seq_term(&hs);
				break;
			}
			if (f->state == RF_OPEN || f->state == RF_EXTENDING)
				running++;
		}
		LWLockRelease(ring->lock);
		if (TransactionIdIsValid(other))
		{
			XactLockTableWait(other, NULL, NULL, XLTW_None);
			waited = true;
		}
	} while (waited);

	if (drop && running > 0 && !force)
		return running;

	/*
	 * The ready jobs: out of their lanes until this transaction ends, one 'x'
	 * log row per thousand (a closing row implies its claim, so the rebuild
	 * finds them finished).
	 */
	for (;;)
	{
		int64		tok = 0;
		int64		ids[1000];
		RingLane   *held[1000];
		int			nheld = -1,
					h = 0;
		int			k = 0;
		RingQueue  *q;
		bool		any;

		LWLockAcquire(ring->lock, LW_SHARED);
		q = ring_queue_get(queue_id, false);
		any = q != NULL && q->ready > 0;
		LWLockRelease(ring->lock);
		if (!any)
			break;
		ring_reserve_dropped(1000);
		tok = ring_next_token(&tok);
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
		q = ring_queue_get(queue_id, false);
		/* lanes parked at a key limit go too */
		if (q != NULL)
			ring_queue_unpark_all(q);
		while (q != NULL && k < 1000)
		{
			RingLane   *l = ring_next_lane(q);
			RingPos		p;

			/*
			 * and the lanes of held keys, out of the round robin: found in
			 * one walk of the lane table per chunk (they stay pinned, so
			 * unlinked, until this transaction ends)
			 */
			if (l == NULL)
			{
				if (nheld < 0)
					nheld = ring_holds_held_lanes(q, held, 1000 - k);
				while (h < nheld && held[h]->count == 0)
					h++;
				l = h < nheld ? held[h] : NULL;
			}
			if (l == NULL)
				break;
			ring_lane_pop_front(l, &p);
			ring_note_dropped(&p, l);
			ring_lane_settle(l);
			ids[k++] = p.id;
		}
		LWLockRelease(ring->lock);
		if (k > 0)
		{
			ring_log_append(tok, GetCurrentTimestamp(), 'x', ids, k);
			/* their dedup anchors, if any (drop_queue deletes them anyway) */
			if (!drop)
				ring_anchors_end(k, ids);
		}
		*nready += k;
	}

	if (running_too && running > 0)
	{
		HASH_SEQ_STATUS hs;
		RingFlight *f;
		bool	   *found,
				   *ok;
		RingFlight *fl;

		rid = palloc(sizeof(int64) * running);
		rtok = palloc(sizeof(int64) * running);
		LWLockAcquire(ring->lock, LW_SHARED);
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
			if (f->key.dbid == MyDatabaseId && f->queue_id == queue_id &&
				(f->state == RF_OPEN || f->state == RF_EXTENDING) && nrun < running)
			{
				rid[nrun] = f->key.id;
				rtok[nrun] = f->token;
				nrun++;
			}
		LWLockRelease(ring->lock);
		found = palloc(sizeof(bool) * Max(nrun, 1));
		ok = palloc(sizeof(bool) * Max(nrun, 1));
		fl = palloc(sizeof(RingFlight) * Max(nrun, 1));
		(void) ring_close_claims(nrun, rid, rtok, found, ok, fl, 0);
		{
			int			m = 0;

			for (int i = 0; i < nrun; i++)
				if (ok[i])
				{
					rid[m] = rid[i];
					rtok[m] = rtok[i];
					m++;
				}
			if (m > 0)
				ring_log_closes('x', GetCurrentTimestamp(), m, rid, rtok);
		}
	}
	/* its jobs ended or vanished: wait_jobs() callers look again */
	if (*nready > 0 || nrun > 0)
		pgjq_wait_note_finished(0, 0);
	return running;
}
