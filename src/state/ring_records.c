/*-------------------------------------------------------------------------
 *
 * ring_records.c
 *	  The ring engine's shared records: per-database records with the ring's
 *	  slots, per-queue records with a round-robin ring of lanes for each
 *	  priority, the lanes (ready positions as lists of a bounded node pool)
 *	  and the in-flight table; finding, making and giving them back.
 *	  ring_xact.c moves jobs between them when a transaction commits or
 *	  aborts; the engine's ring files when they claim, enqueue and finish.
 *
 * A record is given back when nothing needs it any more: a lane's and its
 * priority's when their last job ends, an empty queue's when its queue is
 * dropped or another queue needs the room, a database's when the database
 * or the extension is dropped.  A call that would need more fails with
 * 53000 or 54000 and a hint naming the setting (ring_shmem.c has the
 * bounds); nothing is lost and nothing half-done (the call's transaction
 * aborts).  Node room is reserved before a job is appended, so the pushes
 * here never fail.
 *
 * Locking: every function here runs with ring->lock held (exclusively for
 * a change) unless it says otherwise; pgjq_ring_keys_freed takes it.
 * See ring_internal.h.
 *
 *-------------------------------------------------------------------------
 */
#include "state/ring_internal.h"
#include "state/limits.h"

#include "access/transam.h"
#include "miscadmin.h"
#include "utils/timestamp.h"

/* ---------------------------------------------------------------------
 * databases, queues, lanes (every function: the caller holds ring->lock)
 * --------------------------------------------------------------------- */

/* This database's record, or NULL (lock held in either mode). */
RingDb *
ring_db_find(void)
{
	for (int i = 0; i < ring->ndbs; i++)
		if (ring->dbs[i].dbid == MyDatabaseId)
			return &ring->dbs[i];
	return NULL;
}

/* This database's record, taking a free one if needed; NULL when full. */
RingDb *
ring_db(void)
{
	RingDb	   *free_db = NULL;

	for (int i = 0; i < ring->ndbs; i++)
	{
		if (ring->dbs[i].dbid == MyDatabaseId)
			return &ring->dbs[i];
		if (ring->dbs[i].dbid == InvalidOid && free_db == NULL)
			free_db = &ring->dbs[i];
	}
	if (free_db != NULL)
	{
		memset(free_db, 0, sizeof(RingDb));
		free_db->dbid = MyDatabaseId;
		free_db->hold_next = DT_NOEND;
	}
	return free_db;
}

/*
 * Forget everything of this database (before a rebuild, or when the
 * extension was dropped and created again): its lanes, queues and in-flight
 * entries, and the node room they held.
 */
void
ring_clear_db(RingDb *db)
{
	HASH_SEQ_STATUS hs;
	RingFlight *f;
	RingLane   *l;
	RingQueue  *q;

	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
		if (f->key.dbid == db->dbid)
		{
			if (f->state == RF_CLAIMING && !f->pending)
				ring->held--;
			hash_search(ring_flights, &f->key, HASH_REMOVE, NULL);
		}
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
		if (l->key.dbid == db->dbid)
		{
			RingPos		p;

			while (l->count > 0)
				ring_lane_pop_front(l, &p);
			if (l->parked)
				ring->parked--;
			hash_search(ring_lanes, &l->key, HASH_REMOVE, NULL);
		}
	{
		RingPrio   *r;

		hash_seq_init(&hs, ring_prios);
		while ((r = hash_seq_search(&hs)) != NULL)
			if (r->key.dbid == db->dbid)
				hash_search(ring_prios, &r->key, HASH_REMOVE, NULL);
	}
	hash_seq_init(&hs, ring_queues);
	while ((q = hash_seq_search(&hs)) != NULL)
		if (q->key.dbid == db->dbid)
			hash_search(ring_queues, &q->key, HASH_REMOVE, NULL);
	{
		RingHold   *h;

		hash_seq_init(&hs, ring_holds);
		while ((h = hash_seq_search(&hs)) != NULL)
			if (h->key.dbid == db->dbid)
			{
				hash_search(ring_holds, &h->key, HASH_REMOVE, NULL);
				ring->nholds--;
			}
		db->nholds = 0;
		db->hold_next = DT_NOEND;
	}
	ring_rates_clear(db->dbid, 0);
	db->ready = false;
}

/* Nothing refers to the queue's record: no lane, so no job (lock held). */
static bool
queue_empty(const RingQueue *q)
{
	return q->lanes == 0 && q->ready == 0 && q->running == 0 && q->claiming == 0;
}

/*
 * The table of queue records is full: give back the records of empty queues
 * (of every database).  An empty record keeps only table_maybe, which a
 * missing record stands for too ("maybe": the next claim looks at pgjq.job
 * once), so a queue that was emptied once does not hold its record forever.
 * O(pgjq.ring_max_queues), only when the table is full.
 */
static int
queues_give_back(void)
{
	HASH_SEQ_STATUS hs;
	RingQueue  *q;
	int			n = 0;

	hash_seq_init(&hs, ring_queues);
	while ((q = hash_seq_search(&hs)) != NULL)
		if (queue_empty(q))
		{
			hash_search(ring_queues, &q->key, HASH_REMOVE, NULL);
			n++;
		}
	return n;
}

/*
 * A queue's record, made if missing with create (NULL when the table is
 * full of non-empty queues).  A new record assumes pgjq.job may have ready
 * rows of the queue, with a generation no earlier record had, so that a
 * claim that read the flag of a record given back since cannot clear the
 * flag of the new one (pgjq_ring_table_empty).  Nothing keeps a pointer to
 * a record across a release of the lock but its lanes (l->queue), and a
 * record with lanes is never given back.
 */
RingQueue *
ring_queue_get(int32 queue_id, bool create)
{
	RingQueueKey key;
	bool		found;
	RingQueue  *q;

	memset(&key, 0, sizeof(key));
	key.dbid = MyDatabaseId;
	key.queue_id = queue_id;
	q = hash_search(ring_queues, &key, create ? HASH_ENTER_NULL : HASH_FIND, &found);
	if (q == NULL && create && queues_give_back() > 0)
		q = hash_search(ring_queues, &key, HASH_ENTER_NULL, &found);
	if (q != NULL && !found)
	{
		q->nprios = 0;
		q->prios = NULL;
		q->lanes = 0;
		q->ready = q->running = q->claiming = q->claiming_own = 0;
		q->table_maybe = true;
		q->table_gen = ++ring->table_gen;
	}
	return q;
}

/* The queue's record goes if it is empty (its queue was dropped). */
void
ring_queue_forget(Oid dbid, int32 queue_id)
{
	RingQueueKey key;
	RingQueue  *q;

	memset(&key, 0, sizeof(key));
	key.dbid = dbid;
	key.queue_id = queue_id;
	q = hash_search(ring_queues, &key, HASH_FIND, NULL);
	if (q != NULL && queue_empty(q))
		hash_search(ring_queues, &key, HASH_REMOVE, NULL);
}

/*
 * The ring of the queue's priority, made if missing (in ascending place; a
 * walk of the queue's priorities, only for a new one).  NULL only when the
 * pool is full, which a lane that fits never finds (ring_prios has as many
 * records as ring_lanes).
 */
static RingPrio *
prio_get(RingQueue *q, int32 priority)
{
	RingPrioKey key;
	bool		found;
	RingPrio   *r;

	memset(&key, 0, sizeof(key));
	key.dbid = q->key.dbid;
	key.queue_id = q->key.queue_id;
	key.priority = priority;
	r = hash_search(ring_prios, &key, HASH_ENTER_NULL, &found);
	if (r != NULL && !found)
	{
		RingPrio   *before = NULL;

		r->head = NULL;
		r->parked = 0;
		r->nlanes = 0;
		for (RingPrio *c = q->prios; c != NULL && c->key.priority < priority; c = c->next)
			before = c;
		r->prev = before;
		r->next = before ? before->next : q->prios;
		if (r->next)
			r->next->prev = r;
		if (before)
			before->next = r;
		else
			q->prios = r;
		q->nprios++;
	}
	return r;
}

/* The priority's last lane went: its ring goes. */
static void
prio_drop(RingQueue *q, RingPrio *r)
{
	if (r->prev)
		r->prev->next = r->next;
	else
		q->prios = r->next;
	if (r->next)
		r->next->prev = r->prev;
	q->nprios--;
	hash_search(ring_prios, &r->key, HASH_REMOVE, NULL);
}

/*
 * The lane's priority ring.  A lane holds its priority from its creation to
 * its removal, so this is never NULL; should it be (a bug), the ring is
 * made again rather than a callback crashing.
 */
static RingPrio *
lane_prio(RingLane *l)
{
	if (unlikely(l->prio == NULL))
	{
		l->prio = prio_get(l->queue, l->key.priority);
		if (l->prio != NULL)
			l->prio->nlanes++;
	}
	return l->prio;
}

static void
lane_link(RingLane *l)
{
	RingPrio   *r = lane_prio(l);

	if (r == NULL)
		return;					/* cannot happen (see lane_prio) */
	if (r->head == NULL)
	{
		l->next = l->prev = l;
		r->head = l;
	}
	else
	{
		/* at the tail: it waits for its turn behind the others */
		RingLane   *h = r->head;

		l->next = h;
		l->prev = h->prev;
		h->prev->next = l;
		h->prev = l;
	}
	l->linked = true;
}

static void
lane_unlink(RingLane *l)
{
	RingPrio   *r = l->prio;

	if (l->next == l || l->next == NULL)
	{
		if (r != NULL && r->head == l)
			r->head = NULL;
	}
	else
	{
		l->prev->next = l->next;
		l->next->prev = l->prev;
		if (r != NULL && r->head == l)
			r->head = l->next;
	}
	l->next = l->prev = NULL;
	l->linked = false;
}

/* lock held: out of its priority's ring until a job of its key ends */
void
ring_lane_park(RingLane *l)
{
	if (l->parked)
		return;
	if (l->linked)
		lane_unlink(l);
	l->parked = true;
	if (lane_prio(l) != NULL)
		l->prio->parked++;
	ring->parked++;
}

static void
lane_unpark(RingLane *l)
{
	l->parked = false;
	if (l->prio != NULL)
		l->prio->parked--;
	ring->parked--;
}

/*
 * Whether the lane is held back: its key held (ring_holds, ring_holds.c
 * changes it) or at its key_rate (key_rate.c).  Lock held in any mode.
 */
bool
ring_lane_held(const RingLane *l)
{
	RingHoldKey k;
	RingHold   *h;
	TimestampTz now;

	/* nothing held or throttled anywhere: no clock read */
	if (ring->nholds == 0 && !ring_rates_any())
		return false;
	now = GetCurrentTimestamp();
	/* a key at its key_rate is out until its next token (key_rate.c) */
	if (ring_rate_throttled(&l->key, now))
		return true;
	if (ring->nholds == 0)
		return false;
	memset(&k, 0, sizeof(k));
	k.dbid = l->key.dbid;
	k.queue_id = l->key.queue_id;
	k.keyhash = l->key.keyhash;
	h = hash_search(ring_holds, &k, HASH_FIND, NULL);
	return h != NULL && h->until > now;
}

/*
 * After a lane's counts changed: linked exactly when it has ready jobs (and
 * is not parked),
 * dropped when nothing refers to it any more, with its priority's ring
 * when it was that priority's last lane.
 */
void
ring_lane_settle(RingLane *l)
{
	bool		want;

	/* a parked lane without ready jobs has nothing left to hold back */
	if (l->parked && l->count == 0)
		lane_unpark(l);
	want = l->count > 0 && !l->parked && !ring_lane_held(l);
	if (want && !l->linked)
		lane_link(l);
	else if (!want && l->linked)
		lane_unlink(l);
	if (!l->linked && l->count == 0 && l->running == 0 && l->pinned == 0)
	{
		RingQueue  *q = l->queue;
		RingPrio   *r = l->prio;

		q->lanes--;
		hash_search(ring_lanes, &l->key, HASH_REMOVE, NULL);
		if (r != NULL && --r->nlanes == 0)
			prio_drop(q, r);
	}
}

/*
 * The lane of a key, made if missing with its priority's ring (NULL when
 * pgjq.ring_max_lanes are used).
 */
RingLane *
ring_lane_get(const RingLaneKey *key, RingQueue *q)
{
	bool		found;
	RingLane   *l = hash_search(ring_lanes, key, HASH_ENTER_NULL, &found);

	if (l != NULL && !found)
	{
		RingPrio   *r = prio_get(q, key->priority);

		if (r == NULL)
		{
			/* cannot happen: the pool has a record for every lane */
			hash_search(ring_lanes, key, HASH_REMOVE, NULL);
			return NULL;
		}
		r->nlanes++;
		l->prio = r;
		l->head = l->tail = -1;
		l->count = l->running = l->pinned = 0;
		l->linked = false;
		l->parked = false;
		l->prev = l->next = NULL;
		l->queue = q;
		q->lanes++;
	}
	return l;
}

/* node room is reserved by the callers: these never fail */
void
ring_lane_push_back(RingLane *l, const RingPos *p)
{
	int32		n = ring->free_head;

	Assert(n >= 0);
	ring->free_head = ring->nodes[n].next;
	ring->nodes[n].p = *p;
	ring->nodes[n].next = -1;
	if (l->tail >= 0)
		ring->nodes[l->tail].next = n;
	else
		l->head = n;
	l->tail = n;
	l->count++;
	l->queue->ready++;
	ring->count++;
}

void
ring_lane_push_front(RingLane *l, const RingPos *p)
{
	int32		n = ring->free_head;

	Assert(n >= 0);
	ring->free_head = ring->nodes[n].next;
	ring->nodes[n].p = *p;
	ring->nodes[n].next = l->head;
	l->head = n;
	if (l->tail < 0)
		l->tail = n;
	l->count++;
	l->queue->ready++;
	ring->count++;
}

void
ring_lane_pop_front(RingLane *l, RingPos *p)
{
	int32		n = l->head;

	*p = ring->nodes[n].p;
	l->head = ring->nodes[n].next;
	if (l->head < 0)
		l->tail = -1;
	ring->nodes[n].p.id = 0;
	ring->nodes[n].next = ring->free_head;
	ring->free_head = n;
	l->count--;
	l->queue->ready--;
	ring->count--;
}

/* Take the job out of the lane wherever it is (O(lane length)). */
bool
ring_lane_remove(RingLane *l, int64 id, RingPos *p)
{
	int32		prev = -1;

	for (int32 n = l->head; n >= 0; prev = n, n = ring->nodes[n].next)
	{
		if (ring->nodes[n].p.id != id)
			continue;
		*p = ring->nodes[n].p;
		if (prev < 0)
			l->head = ring->nodes[n].next;
		else
			ring->nodes[prev].next = ring->nodes[n].next;
		if (l->tail == n)
			l->tail = prev;
		ring->nodes[n].p.id = 0;
		ring->nodes[n].next = ring->free_head;
		ring->free_head = n;
		l->count--;
		l->queue->ready--;
		ring->count--;
		return true;
	}
	return false;
}

/* Every parked lane of the queue back in its ring (lock held; O(lanes)). */
void
ring_queue_unpark_all(RingQueue *q)
{
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	int32		parked = 0;

	for (RingPrio *r = q->prios; r != NULL; r = r->next)
		parked += r->parked;
	if (parked == 0)
		return;
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
		if (l->queue == q && l->parked)
		{
			lane_unpark(l);
			ring_lane_settle(l);
		}
}

/* A lane of the queue a claim could take from now (lock held). */
bool
ring_queue_claimable(RingQueue *q)
{
	for (RingPrio *r = q->prios; r != NULL; r = r->next)
		if (r->head != NULL)
			return true;
	return false;
}

/* The limits.c hash of a lane's key (0, no fair key, is the key ''). */
uint64
ring_limits_hash(uint64 lanehash)
{
	return lanehash != 0 ? lanehash : pgjq_limits_key_hash("", 0);
}

/*
 * limits.c: the running counts of these (queue, key hash) pairs went down
 * (a job ended, a reservation was given back).  Their parked lanes go back
 * into their rings; a claim parks a lane again if its key is still full.
 * Called after limits.c released its lock, in its callbacks too: never
 * fails.  A claim parks a lane only under the ring's lock right after it
 * found the key full, so an unpark that follows the decrement cannot be lost.
 */
void
pgjq_ring_keys_freed(int n, const int32 *queue_ids, const uint64 *hashes)
{
	uint64		empty;

	if (ring == NULL)
		return;
	LWLockAcquire(ring->lock, LW_SHARED);
	if (ring->parked == 0)
	{
		LWLockRelease(ring->lock);
		return;
	}
	LWLockRelease(ring->lock);
	empty = pgjq_limits_key_hash("", 0);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n && ring->parked > 0; i++)
	{
		RingQueue  *q = ring_queue_get(queue_ids[i], false);

		if (q == NULL)
			continue;
		for (RingPrio *r = q->prios, *next; r != NULL; r = next)
		{
			RingLaneKey k;
			RingLane   *l;

			/* settling the lane may drop its priority's ring */
			next = r->next;
			if (r->parked == 0)
				continue;
			memset(&k, 0, sizeof(k));
			k.dbid = MyDatabaseId;
			k.queue_id = queue_ids[i];
			k.keyhash = hashes[i] == empty ? 0 : hashes[i];
			k.priority = r->key.priority;
			l = hash_search(ring_lanes, &k, HASH_FIND, NULL);
			if (l != NULL && l->parked)
			{
				lane_unpark(l);
				ring_lane_settle(l);
			}
		}
	}
	LWLockRelease(ring->lock);
}

/*
 * The lane a claim takes its next job from: the head of the most urgent
 * priority's ring, which then turns to the next lane.  NULL when the queue
 * has no ready job.
 */
RingLane *
ring_next_lane(RingQueue *q)
{
	for (RingPrio *r = q->prios; r != NULL; r = r->next)
	{
		RingLane   *l = r->head;

		if (l != NULL)
		{
			r->head = l->next;
			return l;
		}
	}
	return NULL;
}

void
ring_lane_key(RingLaneKey *k, int32 queue_id, int32 priority, const char *fair_key, int keylen)
{
	memset(k, 0, sizeof(RingLaneKey));
	k->dbid = MyDatabaseId;
	k->queue_id = queue_id;
	k->priority = priority;
	if (fair_key != NULL && keylen > 0)
	{
		/* limits.c's hash: a key limit counts lanes by it */
		k->keyhash = pgjq_limits_key_hash(fair_key, keylen);
	}
}

RingFlight *
ring_flight_find(int64 id)
{
	RingFlightKey key;

	memset(&key, 0, sizeof(key));
	key.id = id;
	key.dbid = MyDatabaseId;
	return hash_search(ring_flights, &key, HASH_FIND, NULL);
}

/* A new entry (NULL when pgjq.ring_max_in_flight are in use). */
RingFlight *
ring_flight_enter(int64 id)
{
	RingFlightKey key;
	bool		found;
	RingFlight *f;

	memset(&key, 0, sizeof(key));
	key.id = id;
	key.dbid = MyDatabaseId;
	f = hash_search(ring_flights, &key, HASH_ENTER_NULL, &found);
	Assert(f == NULL || !found);
	if (f != NULL)
	{
		f->reloc_slot = RING_NO_SLOT;
		f->claim_slot = RING_NO_SLOT;
		f->cancel_requested = false;
		f->anchored = false;
		f->deadline = 0;
	}
	return f;
}

void
ring_flight_remove(int64 id)
{
	RingFlightKey key;

	memset(&key, 0, sizeof(key));
	key.id = id;
	key.dbid = MyDatabaseId;
	hash_search(ring_flights, &key, HASH_REMOVE, NULL);
}

/* ---------------------------------------------------------------------
 * a slot's count, an in-flight entry's body, a queue's claims, as a
 * transaction's end moves them (ring_xact.c; the lock held)
 * --------------------------------------------------------------------- */

/*
 * Lock held: a job of slot s finished or moved to another slot, in
 * transaction xid, which is committing now or has committed
 * (InvalidTransactionId: unknown, so every xid assigned so far stands for
 * it).
 */
void
ring_slot_left(RingDb *db, int s, TransactionId xid)
{
	RingSlot   *st = &db->slots[s];

	if (!TransactionIdIsValid(xid))
		xid = ReadNextTransactionId();
	st->open--;
	if (!TransactionIdIsValid(st->left_xid) || TransactionIdFollows(xid, st->left_xid))
		st->left_xid = xid;
}

/*
 * lock held: an in-flight entry whose owner's transaction ends takes on the
 * relocated copy of its body recorded meanwhile (its owner may have been
 * reading the old one until now).
 */
void
ring_flight_take_reloc(RingDb *db, RingFlight *f)
{
	if (f->reloc_slot == RING_NO_SLOT)
		return;
	if (db)
	{
		/* when the relocation that copied it committed */
		ring_slot_left(db, f->slot, f->reloc_xid);
		db->slots[f->reloc_slot].open++;
	}
	f->tid = f->reloc_tid;
	f->slot = f->reloc_slot;
	f->reloc_slot = RING_NO_SLOT;
}

/* lock held: the claim of f committed or went away (RingQueue.claiming) */
void
ring_claim_ended(RingFlight *f)
{
	RingQueue  *q = f->lane->queue;

	q->claiming--;
	if (f->pending)
		q->claiming_own--;
}

/* lock held: a claim of f begins (f->pending set) */
void
ring_claim_begun(RingFlight *f)
{
	RingQueue  *q = f->lane->queue;

	q->claiming++;
	if (f->pending)
		q->claiming_own++;
}
