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
 * claims when the transaction commits (ring_xact.c).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring_store_internal.h"
#include "state/limits_claim.h"

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

/*
 * What the steps of one claim call share: the call's arguments, its token,
 * the jobs taken (got, in the order taken), why fewer than batch were taken,
 * and what their bodies say.
 */
typedef struct ClaimCall
{
	const PgjqQueue *queue;
	int			batch;
	PgjqClaimQuota *quota;
	bool		key_limited;	/* the queue has a key_concurrency */
	bool		key_rated;		/* the queue has a key_rate */
	TimestampTz lease_asked;	/* the lease the caller asked for */
	TimestampTz lease_until;	/* that, no later than the queue's deadline */
	TimestampTz deadline;		/* the queue's execution deadline; 0: none */
	TimestampTz claimed_at;
	TransactionId xid;
	int64		tok;
	RingQueue  *q;				/* lock held: the queue's record */

	/* the jobs taken */
	int			k;
	RingPos    *got;
	int64	   *gotids;
	uint64	   *gothash;		/* limits.c's hash of each job's key */

	/* why fewer than batch were taken */
	bool		in_flight_full;
	bool		counters_full;
	bool		rates_full;

	/* from their bodies and the claim's log rows */
	bool	   *anchored;
	TimestampTz *deadlines;
	ItemPointerData *claim_tids;
	int			claim_slot;
	int64	   *waiting_keys;	/* jobs whose 'waiting' dedup_key the claim
								 * frees */
	int			nwaiting;
} ClaimCall;

/* What claim_key_checks decided for the head of a lane. */
#define CLAIM_TAKE	1			/* take it */
#define CLAIM_NEXT	0			/* not this one: the next lane */
#define CLAIM_STOP	(-1)		/* no more jobs in this call */

/*
 * Before anything is drawn: the ring ready, the leases bounded by the
 * queue's execution deadline, space given back, ended holds and due rate
 * tokens applied, and a shared look whether there is anything to take.
 * False for an empty poll, which draws no token and writes nothing.
 */
static bool
claim_begin(ClaimCall *c, TimestampTz lease_until)
{
	bool		any;
	bool		held;
	RingQueue  *q;

	if (!ring_ensure_ready(true))
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot use a ring queue during recovery")));
	/* the queue's execution deadline: no lease of these jobs goes past it */
	c->lease_asked = lease_until;
	c->lease_until = lease_until;
	c->claimed_at = GetCurrentTimestamp();
	if (c->queue->timeout_us > 0)
	{
		c->deadline = c->claimed_at + c->queue->timeout_us;
		c->lease_until = Min(c->lease_until, c->deadline);
	}
	ring_client_truncate();
	/* holds that ended give their keys' lanes back first (key_hold.c) */
	ring_holds_expire_due();
	/* and keys at their key_rate whose next token is due (key_rate.c) */
	ring_rates_expire_due();
	/* an empty poll draws no token and writes nothing */
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(c->queue->queue_id, false);
	any = q != NULL && (ring_queue_claimable(q) || ring_has_own(c->queue->queue_id));
	/* ready jobs, all of keys at their limit: held back, as on pgjq.job */
	held = !any && q != NULL && q->ready > 0 && c->key_limited;
	/* ready jobs, all of keys out until their next token */
	c->quota->key_rate_cut = !any && q != NULL && q->ready > 0 && c->key_rated;
	LWLockRelease(ring->lock);
	if (held && !c->quota->key_rate_cut)
		pgjq_limits_quota_held(c->quota);
	return any;
}

/* The token drawn, room reserved, and the arrays for up to batch jobs. */
static void
claim_prepare(ClaimCall *c, int64 *token)
{
	int			batch = c->batch;

	/* a key limit counts each job under the ring's lock: room before it */
	if (c->key_limited)
		pgjq_limits_reserve_room(batch);

	c->xid = GetTopTransactionId();
	c->tok = ring_next_token(token);
	c->got = palloc(sizeof(RingPos) * batch);
	c->gotids = palloc(sizeof(int64) * batch);
	c->gothash = palloc(sizeof(uint64) * batch);
	c->anchored = palloc(sizeof(bool) * batch);
	c->deadlines = palloc(sizeof(TimestampTz) * batch);
	c->claim_tids = palloc(sizeof(ItemPointerData) * batch);
	c->waiting_keys = palloc(sizeof(int64) * batch);
	ring_reserve_local(0, batch, 0);
}

/*
 * Lock held: the new in-flight entry f claims p of lane l for this call (a
 * committed job taken from its lane, or with pending, this transaction's
 * own job taken from its pending list).
 */
static void
claim_flight(ClaimCall *c, RingFlight *f, RingLane *l, const RingPos *p, bool pending)
{
	l->running++;
	c->q->running++;
	f->token = c->tok;
	f->lease_until = c->lease_until;
	f->deadline = c->deadline;
	f->pending = pending;
	f->enqueued_at = p->enqueued_at;
	f->xid = c->xid;
	f->tid = p->tid;
	f->slot = p->slot;
	f->state = RF_CLAIMING;
	f->attempt = 1;
	f->queue_id = c->queue->queue_id;
	f->lane = l;
	if (!pending)
	{
		ring_lane_settle(l);
		ring->held++;
	}
	c->got[c->k] = *p;
	c->gotids[c->k] = p->id;
	c->gothash[c->k] = ring_limits_hash(l->key.keyhash);
	ring_claim_begun(f);
	ring_note_claimed(p->id);
	c->k++;
}

/*
 * Lock held: the key limits of the job id at the head of lane l, whose
 * in-flight entry was just made (and goes again if it is not taken).
 */
static int
claim_key_checks(ClaimCall *c, RingLane *l, int64 id)
{
	if (c->key_rated)
	{
		/* its key's bucket: without a token, out until the next one */
		int			r = ring_rate_take(c->queue, l->key.keyhash, GetCurrentTimestamp());

		if (r != 1)
		{
			ring_flight_remove(id);
			c->rates_full = r == -1;
			c->quota->key_rate_cut = true;
			/* never the same lane again in this loop */
			if (r == 0 && !l->linked)
				return CLAIM_NEXT;
			return CLAIM_STOP;
		}
	}
	if (c->key_limited)
	{
		/*
		 * Its key at key_concurrency: out of the ring until one of its jobs
		 * ends (pgjq_ring_keys_freed), so the next claim does not look at it
		 * again: O(batch) however many keys are full.
		 */
		int			r = pgjq_limits_ring_key_take(c->quota, ring_limits_hash(l->key.keyhash));

		if (r != 1)
		{
			ring_flight_remove(id);
			if (r == 0)
			{
				ring_lane_park(l);
				return CLAIM_NEXT;
			}
			/* -1: no counter entry free; -2: keys not countable now */
			c->counters_full = r == -1;
			return CLAIM_STOP;
		}
	}
	if (c->key_rated)
		ring_rate_spend(c->queue, l->key.keyhash);
	return CLAIM_TAKE;
}

/* Lock held: committed jobs from the queue's lanes, in round robin. */
static void
claim_from_lanes(ClaimCall *c)
{
	while (c->k < c->batch)
	{
		RingLane   *l = ring_next_lane(c->q);
		RingFlight *f;
		RingPos		p;
		int64		id;
		int			r;

		if (l == NULL)
			break;
		id = ring->nodes[l->head].p.id;
		f = ring_flight_enter(id);
		if (f == NULL)
		{
			c->in_flight_full = true;	/* claim fewer, or say why none */
			break;
		}
		r = claim_key_checks(c, l, id);
		if (r == CLAIM_NEXT)
			continue;
		if (r == CLAIM_STOP)
			break;
		ring_lane_pop_front(l, &p);
		claim_flight(c, f, l, &p, false);
	}
}

/* Lock held: then this transaction's own jobs, which no other claim can see. */
static void
claim_own(ClaimCall *c)
{
	RingPos    *own = palloc(sizeof(RingPos) * (c->batch - c->k));
	RingLane  **lanes = palloc(sizeof(RingLane *) * (c->batch - c->k));
	int			nown;

	nown = ring_take_own(c->queue->queue_id, c->batch - c->k, own, lanes);
	for (int i = 0; i < nown; i++)
	{
		RingFlight *f = ring_flight_enter(own[i].id);
		int			r = 1;

		int			rr = 1;

		if (f != NULL && c->key_rated)
		{
			rr = ring_rate_take(c->queue, lanes[i]->key.keyhash, GetCurrentTimestamp());
			if (rr != 1)
				ring_flight_remove(own[i].id);
		}
		if (f != NULL && rr == 1 && c->key_limited)
		{
			r = pgjq_limits_ring_key_take(c->quota, ring_limits_hash(lanes[i]->key.keyhash));
			if (r != 1)
				ring_flight_remove(own[i].id);
		}
		if (f == NULL || r != 1 || rr != 1)
		{
			/* give the rest back: they stay pending */
			ring_take_own_undo(own + i, nown - i);
			c->in_flight_full = f == NULL;
			c->counters_full = r == -1;
			c->rates_full = rr == -1;
			break;
		}
		if (c->key_rated)
			ring_rate_spend(c->queue, lanes[i]->key.keyhash);
		claim_flight(c, f, lanes[i], &own[i], true);
	}
}

/*
 * After the lock: why none was taken, said (a bound of the ring raises),
 * and the keys of those taken counted.  False when none was.
 */
static bool
claim_settle(ClaimCall *c)
{
	if (c->counters_full)
		pgjq_limits_counters_full();
	if (c->k == 0 && c->rates_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more rate-limited keys (%d)",
						pgjq_ring_max_rate_keys),
				 errhint("Raise pgjq.ring_max_rate_keys and restart the server.")));
	if (c->k == 0 && c->in_flight_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more running jobs (%d)",
						pgjq_ring_max_in_flight),
				 errhint("Complete running jobs, or raise pgjq.ring_max_in_flight and restart the server.")));
	if (c->k == 0)
		return false;
	/* without a key limit, the keys count as pgjq.job's claims count them */
	pgjq_limits_ring_settle(c->queue, c->k, c->gothash);
	return true;
}

/* The bodies of the jobs taken, read by position into jobs (the result context). */
static void
claim_read_bodies(ClaimCall *c, PgjqClaimedJob *jobs)
{
	Relation	rels[RING_NSLOTS] = {NULL};
	RingPos    *got = c->got;
	MemoryContext old;

	old = MemoryContextSwitchTo(pgjq_result_cxt);
	for (int i = 0; i < c->k; i++)
	{
		BodyRow		b;

		if (rels[got[i].slot] == NULL)
			rels[got[i].slot] = table_open(ring_body_oid[got[i].slot], AccessShareLock);
		ring_body_fetch(rels[got[i].slot], got[i].id, &got[i].tid, &b);
		jobs[i].id = b.id;
		jobs[i].token = c->tok;
		jobs[i].lease_until = c->lease_until;
		jobs[i].attempt = b.attempt;
		jobs[i].payload = b.payload;
		jobs[i].fair_key = b.fair_key;
		jobs[i].priority = b.priority;
		jobs[i].enqueued_at = b.enqueued_at;
		c->anchored[i] = BODY_ANCHORED_RUNNING(&b);
		if (b.dedup_key != (Datum) 0 && b.dedup_scope == 'w')
			c->waiting_keys[c->nwaiting++] = b.id;
		/* a job's own timeout replaces the queue's: its own deadline */
		c->deadlines[i] = c->deadline;
		if (b.timeout_us > 0)
		{
			c->deadlines[i] = c->claimed_at + b.timeout_us;
			jobs[i].lease_until = Min(c->lease_asked, c->deadlines[i]);
		}
	}
	MemoryContextSwitchTo(old);
	for (int s = 0; s < RING_NSLOTS; s++)
		if (rels[s])
			table_close(rels[s], NoLock);
}

/*
 * The claim's durable row: one, unless jobs with their own timeout have
 * other deadlines than the rest (then one per deadline, each with its
 * lease)
 */
static void
claim_log(ClaimCall *c, const PgjqClaimedJob *jobs, const char *worker)
{
	int			k = c->k;
	int64	   *ids = c->gotids;	/* reused: the ids of one row */
	bool	   *done = palloc0(sizeof(bool) * k);

	c->claim_slot = ring_slot_for_write(0);
	for (int i = 0; i < k; i++)
	{
		int			m = 0;

		if (done[i])
			continue;
		for (int j = i; j < k; j++)
			if (!done[j] && c->deadlines[j] == c->deadlines[i])
			{
				ids[m++] = jobs[j].id;
				done[j] = true;
			}
		ring_log_append_to(c->claim_slot, c->tok, jobs[i].lease_until, 'c', ids, m, worker,
						   c->deadlines[i], &c->claim_tids[i]);
		for (int j = i + 1; j < k; j++)
			if (c->deadlines[j] == c->deadlines[i])
				c->claim_tids[j] = c->claim_tids[i];
	}
}

/* What complete needs for the history, without reading the body again. */
static void
claim_note_flights(ClaimCall *c, const PgjqClaimedJob *jobs)
{
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < c->k; i++)
	{
		RingFlight *f = ring_flight_find(jobs[i].id);

		if (f != NULL)
		{
			f->attempt = jobs[i].attempt;
			f->enqueued_at = jobs[i].enqueued_at;
			f->anchored = c->anchored[i];
			f->claim_tid = c->claim_tids[i];
			f->claim_slot = (uint16) c->claim_slot;
			f->lease_until = jobs[i].lease_until;
			f->deadline = c->deadlines[i];
		}
	}
	LWLockRelease(ring->lock);
}

/*
 * Claim up to batch jobs of the queue for worker, with one token (*token,
 * drawn if 0) and a lease until lease_until; returns how many (in jobs).
 */
int
pgjq_ring_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
				const char *worker, PgjqClaimQuota *quota, int64 *token,
				PgjqClaimedJob *jobs)
{
	ClaimCall	c;

	memset(&c, 0, sizeof(c));
	c.queue = queue;
	c.batch = batch;
	c.quota = quota;
	c.key_limited = queue->key_concurrency > 0;
	c.key_rated = queue->key_rate > 0;
	if (!claim_begin(&c, lease_until))
		return 0;
	claim_prepare(&c, token);

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	c.q = ring_queue_get(queue->queue_id, false);
	if (c.q != NULL)
		claim_from_lanes(&c);
	if (c.q != NULL && c.k < batch)
		claim_own(&c);
	LWLockRelease(ring->lock);

	if (!claim_settle(&c))
		return 0;
	claim_read_bodies(&c, jobs);
	claim_log(&c, jobs, worker);
	/* a key held only while the job waited is free from this claim on */
	ring_anchors_end(c.nwaiting, c.waiting_keys);
	claim_note_flights(&c, jobs);
	return c.k;
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
