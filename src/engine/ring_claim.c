/*-------------------------------------------------------------------------
 *
 * ring_claim.c
 *	  Claim of ring jobs: lanes taken in round robin from shared
 *	  memory, the bodies read by position, one 'c' log row per claim call.
 *
 * Order of a claim (pgjq_ring_claim, each a step below): the ring made ready
 * and space given back when due (ring_client_truncate, ended holds and rate
 * tokens); an empty poll returns here, drawing no token and writing nothing;
 * then the token is drawn and room reserved; under the ring's LWLock
 * (exclusive, no I/O) jobs are taken from the queue's lanes, then from this
 * transaction's own unpublished enqueues, each checked against its key's
 * rate and concurrency limits; after the lock, the bodies are read (no MVCC
 * test: publication proves them), the claim's 'c' log rows written, dedup
 * keys held only while waiting freed, and the in-flight entries given what
 * an outcome needs (again under the lock).  The entries become everyone's
 * claims when the transaction commits (ring_shmem.c).
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

/* ---------------------------------------------------------------------
 * claim
 * --------------------------------------------------------------------- */

int
pgjq_ring_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
				const char *worker, PgjqClaimQuota *quota, int64 *token,
				PgjqClaimedJob *jobs)
{
	RingPos    *got;
	int64	   *gotids;
	uint64	   *gothash;		/* limits.c's hash of each job's key */
	bool	   *anchored;
	int			k = 0;
	int64		tok;
	TransactionId xid;
	RingQueue  *q;
	bool		any;
	Relation	rels[RING_NSLOTS] = {NULL};
	MemoryContext old;
	bool		in_flight_full = false;
	bool		counters_full = false;
	bool		key_limited = queue->key_concurrency > 0;
	bool		key_rated = queue->key_rate > 0;
	bool		rates_full = false;
	bool		held;
	int			claim_slot;
	ItemPointerData *claim_tids;
	TimestampTz deadline = 0;
	TimestampTz *deadlines;
	TimestampTz lease_asked;
	TimestampTz claimed_at;
	bool	   *done;
	int64	   *waiting_keys;	/* jobs whose 'waiting' dedup_key the claim
								 * frees */
	int			nwaiting = 0;

	if (!ring_ensure_ready(true))
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot use a ring queue during recovery")));
	/* the queue's execution deadline: no lease of these jobs goes past it */
	lease_asked = lease_until;
	claimed_at = GetCurrentTimestamp();
	if (queue->timeout_us > 0)
	{
		deadline = claimed_at + queue->timeout_us;
		lease_until = Min(lease_until, deadline);
	}
	ring_client_truncate();
	/* holds that ended give their keys' lanes back first (key_hold.c) */
	ring_holds_expire_due();
	/* and keys at their key_rate whose next token is due (key_rate.c) */
	ring_rates_expire_due();
	/* an empty poll draws no token and writes nothing */
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue->queue_id, false);
	any = q != NULL && (ring_queue_claimable(q) || ring_has_own(queue->queue_id));
	/* ready jobs, all of keys at their limit: held back, as on pgjq.job */
	held = !any && q != NULL && q->ready > 0 && key_limited;
	/* ready jobs, all of keys out until their next token */
	quota->key_rate_cut = !any && q != NULL && q->ready > 0 && key_rated;
	LWLockRelease(ring->lock);
	if (held && !quota->key_rate_cut)
		pgjq_limits_quota_held(quota);
	if (!any)
		return 0;
	/* a key limit counts each job under the ring's lock: room before it */
	if (key_limited)
		pgjq_limits_reserve_room(batch);

	xid = GetTopTransactionId();
	tok = ring_next_token(token);
	got = palloc(sizeof(RingPos) * batch);
	gotids = palloc(sizeof(int64) * batch);
	gothash = palloc(sizeof(uint64) * batch);
	anchored = palloc(sizeof(bool) * batch);
	deadlines = palloc(sizeof(TimestampTz) * batch);
	claim_tids = palloc(sizeof(ItemPointerData) * batch);
	waiting_keys = palloc(sizeof(int64) * batch);
	ring_reserve_local(0, batch, 0);

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue->queue_id, false);
	while (q != NULL && k < batch)
	{
		RingLane   *l = ring_next_lane(q);
		RingFlight *f;
		RingPos		p;

		if (l == NULL)
			break;
		f = ring_flight_enter(ring->nodes[l->head].p.id);
		if (f == NULL)
		{
			in_flight_full = true;	/* claim fewer, or say why none */
			break;
		}
		if (key_rated)
		{
			/* its key's bucket: without a token, out until the next one */
			int			r = ring_rate_take(queue, l->key.keyhash, GetCurrentTimestamp());

			if (r != 1)
			{
				ring_flight_remove(ring->nodes[l->head].p.id);
				rates_full = r == -1;
				quota->key_rate_cut = true;
				/* never the same lane again in this loop */
				if (r == 0 && !l->linked)
					continue;
				break;
			}
		}
		if (key_limited)
		{
			/*
			 * Its key at key_concurrency: out of the ring until one of its
			 * jobs ends (pgjq_ring_keys_freed), so the next claim does not
			 * look at it again: O(batch) however many keys are full.
			 */
			int			r = pgjq_limits_ring_key_take(quota, ring_limits_hash(l->key.keyhash));

			if (r != 1)
			{
				ring_flight_remove(ring->nodes[l->head].p.id);
				if (r == 0)
				{
					ring_lane_park(l);
					continue;
				}
				/* -1: no counter entry free; -2: keys not countable now */
				counters_full = r == -1;
				break;
			}
		}
		if (key_rated)
			ring_rate_spend(queue, l->key.keyhash);
		ring_lane_pop_front(l, &p);
		l->running++;
		q->running++;
		f->token = tok;
		f->lease_until = lease_until;
		f->deadline = deadline;
		f->pending = false;
		f->enqueued_at = p.enqueued_at;
		f->xid = xid;
		f->tid = p.tid;
		f->slot = p.slot;
		f->state = RF_CLAIMING;
		f->attempt = 1;
		f->queue_id = queue->queue_id;
		f->lane = l;
		ring_lane_settle(l);
		ring->held++;
		got[k] = p;
		gotids[k] = p.id;
		gothash[k] = ring_limits_hash(l->key.keyhash);
		ring_claim_begun(f);
		ring_note_claimed(p.id);
		k++;
	}
	/* then this transaction's own jobs, which no other claim can see */
	if (q != NULL && k < batch)
	{
		RingPos    *own = palloc(sizeof(RingPos) * (batch - k));
		RingLane  **lanes = palloc(sizeof(RingLane *) * (batch - k));
		int			nown;

		nown = ring_take_own(queue->queue_id, batch - k, own, lanes);
		for (int i = 0; i < nown; i++)
		{
			RingFlight *f = ring_flight_enter(own[i].id);
			int			r = 1;

			int			rr = 1;

			if (f != NULL && key_rated)
			{
				rr = ring_rate_take(queue, lanes[i]->key.keyhash, GetCurrentTimestamp());
				if (rr != 1)
					ring_flight_remove(own[i].id);
			}
			if (f != NULL && rr == 1 && key_limited)
			{
				r = pgjq_limits_ring_key_take(quota, ring_limits_hash(lanes[i]->key.keyhash));
				if (r != 1)
					ring_flight_remove(own[i].id);
			}
			if (f == NULL || r != 1 || rr != 1)
			{
				/* give the rest back: they stay pending */
				ring_take_own_undo(own + i, nown - i);
				in_flight_full = f == NULL;
				counters_full = r == -1;
				rates_full = rr == -1;
				break;
			}
			if (key_rated)
				ring_rate_spend(queue, lanes[i]->key.keyhash);
			lanes[i]->running++;
			q->running++;
			f->token = tok;
			f->lease_until = lease_until;
			f->deadline = deadline;
			f->pending = true;
			f->enqueued_at = own[i].enqueued_at;
			f->xid = xid;
			f->tid = own[i].tid;
			f->slot = own[i].slot;
			f->state = RF_CLAIMING;
			f->attempt = 1;
			f->queue_id = queue->queue_id;
			f->lane = lanes[i];
			got[k] = own[i];
			gotids[k] = own[i].id;
			gothash[k] = ring_limits_hash(lanes[i]->key.keyhash);
			ring_claim_begun(f);
			ring_note_claimed(own[i].id);
			k++;
		}
	}
	LWLockRelease(ring->lock);
	if (counters_full)
		pgjq_limits_counters_full();
	if (k == 0 && rates_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more rate-limited keys (%d)",
						pgjq_ring_max_rate_keys),
				 errhint("Raise pgjq.ring_max_rate_keys and restart the server.")));
	if (k == 0 && in_flight_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more running jobs (%d)",
						pgjq_ring_max_in_flight),
				 errhint("Complete running jobs, or raise pgjq.ring_max_in_flight and restart the server.")));
	if (k == 0)
		return 0;
	/* without a key limit, the keys count as pgjq.job's claims count them */
	pgjq_limits_ring_settle(queue, k, gothash);

	old = MemoryContextSwitchTo(pgjq_result_cxt);
	for (int i = 0; i < k; i++)
	{
		BodyRow		b;

		if (rels[got[i].slot] == NULL)
			rels[got[i].slot] = table_open(ring_body_oid[got[i].slot], AccessShareLock);
		ring_body_fetch(rels[got[i].slot], got[i].id, &got[i].tid, &b);
		jobs[i].id = b.id;
		jobs[i].token = tok;
		jobs[i].lease_until = lease_until;
		jobs[i].attempt = b.attempt;
		jobs[i].payload = b.payload;
		jobs[i].fair_key = b.fair_key;
		jobs[i].priority = b.priority;
		jobs[i].enqueued_at = b.enqueued_at;
		anchored[i] = BODY_ANCHORED_RUNNING(&b);
		if (b.dedup_key != (Datum) 0 && b.dedup_scope == 'w')
			waiting_keys[nwaiting++] = b.id;
		/* a job's own timeout replaces the queue's: its own deadline */
		deadlines[i] = deadline;
		if (b.timeout_us > 0)
		{
			deadlines[i] = claimed_at + b.timeout_us;
			jobs[i].lease_until = Min(lease_asked, deadlines[i]);
		}
	}
	MemoryContextSwitchTo(old);
	for (int s = 0; s < RING_NSLOTS; s++)
		if (rels[s])
			table_close(rels[s], NoLock);

	/*
	 * The claim's durable row: one, unless jobs with their own timeout have
	 * other deadlines than the rest (then one per deadline, each with its
	 * lease)
	 */
	claim_slot = ring_slot_for_write(0);
	done = palloc0(sizeof(bool) * k);
	for (int i = 0; i < k; i++)
	{
		int			m = 0;

		if (done[i])
			continue;
		for (int j = i; j < k; j++)
			if (!done[j] && deadlines[j] == deadlines[i])
			{
				gotids[m++] = jobs[j].id;
				done[j] = true;
			}
		ring_log_append_to(claim_slot, tok, jobs[i].lease_until, 'c', gotids, m, worker, deadlines[i],
					  &claim_tids[i]);
		for (int j = i + 1; j < k; j++)
			if (deadlines[j] == deadlines[i])
				claim_tids[j] = claim_tids[i];
	}
	/* a key held only while the job waited is free from this claim on */
	ring_anchors_end(nwaiting, waiting_keys);

	/* what complete needs for the history, without reading the body again */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < k; i++)
	{
		RingFlight *f = ring_flight_find(jobs[i].id);

		if (f != NULL)
		{
			f->attempt = jobs[i].attempt;
			f->enqueued_at = jobs[i].enqueued_at;
			f->anchored = anchored[i];
			f->claim_tid = claim_tids[i];
			f->claim_slot = (uint16) claim_slot;
			f->lease_until = jobs[i].lease_until;
			f->deadline = deadlines[i];
		}
	}
	LWLockRelease(ring->lock);
	return k;
}

bool
pgjq_ring_table_first(int32 queue_id, uint64 *gen)
{
	RingQueue  *q;
	bool		maybe = true;

	*gen = 0;
	if (ring == NULL)
		return true;
	/* this transaction made table jobs of the queue ready: it sees them */
	if (ring_touched_here(queue_id))
		return true;

	/* the common case, every claim: the record exists (a shared look) */
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	if (q != NULL)
	{
		maybe = q->table_maybe;
		*gen = q->table_gen;
	}
	LWLockRelease(ring->lock);
	if (q != NULL)
		return maybe;

	/*
	 * The record is made here if missing, before the probe: a producer that
	 * commits after the probe then finds it and moves its generation on, so
	 * pgjq_ring_table_empty does not clear the flag over its jobs.
	 */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue_id, true);
	if (q != NULL)
	{
		maybe = q->table_maybe;
		*gen = q->table_gen;
	}
	LWLockRelease(ring->lock);
	return maybe;
}

/* pgjq.job had no ready row of the queue when the flag was at gen. */
void
pgjq_ring_table_empty(int32 queue_id, uint64 gen)
{
	RingQueue  *q;

	if (ring == NULL)
		return;
	if (gen == 0)
		return;					/* no record: the flag stays set */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue_id, false);
	if (q != NULL && q->table_gen == gen)
		q->table_maybe = false;
	LWLockRelease(ring->lock);
}

bool
pgjq_ring_claimable(int32 queue_id)
{
	RingQueue  *q;
	bool		any;

	if (ring == NULL || !ring_ensure_ready(false))
		return false;
	ring_holds_expire_due();
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	any = q != NULL && ring_queue_claimable(q);
	LWLockRelease(ring->lock);
	return any;
}
