/*-------------------------------------------------------------------------
 *
 * ring_shmem.c
 *	  The ring engine's shared memory: per-database records with the ring's
 *	  slots, per-queue records with a round-robin ring of lanes for each
 *	  priority, the lanes (ready positions as lists of a bounded node pool)
 *	  and the in-flight table; and the transaction callbacks that move jobs
 *	  between them when a transaction commits or aborts.
 *
 * Bounds (settings, all PGC_POSTMASTER): pgjq.ring_positions nodes (ready
 * jobs plus those being enqueued or claimed), pgjq.ring_max_in_flight
 * running jobs, pgjq.ring_max_lanes lanes (and as many priority rings),
 * pgjq.ring_max_queues queues with ready or running ring jobs,
 * pgjq.max_databases databases.  A record is given back when nothing needs
 * it any more: a lane's and its priority's when their last job ends, an
 * empty queue's when its queue is dropped or another queue needs the room,
 * a database's when the database or the extension is dropped.  A call that
 * would need more fails with 53000 or 54000 and a hint naming the setting;
 * nothing is lost and nothing half-done (the call's transaction aborts).
 *
 * Locking: see ring_internal.h.  The commit callback publishes positions
 * before wait.c wakes waiting claims (it does so after the commit
 * callbacks, in its resource-release callback), so a woken claim finds them.
 *
 * The worker's rescue and its next deadline pass over a claim that an open
 * transaction is extending or closing: that transaction's end decides.  So
 * when a commit (a heartbeat, a cancellation request) or an abort (of a
 * heartbeat, complete, fail...) makes such a claim open again, the callback
 * wakes the worker for its lease end once the claim is published (after
 * the lock): shmem.c's commit wake-up runs before this callback, and an
 * abort has none, so a worker that had looked meanwhile would sleep
 * pgjq.max_sleep past an expired lease or a job's execution deadline.
 * PREPARE TRANSACTION of a transaction with ring work is refused (0A000):
 * its commit would run in another session, which would not publish.
 *
 *-------------------------------------------------------------------------
 */
#include "state/ring_internal.h"
#include "state/limits.h"
#include "state/worker_slots.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "common/crash_points.h"
#include "common/guc.h"
#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

RingShared *ring = NULL;
HTAB	   *ring_flights = NULL;
HTAB	   *ring_lanes = NULL;
HTAB	   *ring_queues = NULL;
HTAB	   *ring_prios = NULL;
HTAB	   *ring_holds = NULL;

static Size
nodes_size(void)
{
	return MAXALIGN(add_size(offsetof(RingShared, nodes),
							 mul_size(pgjq_ring_positions, sizeof(RingNode))));
}

static Size
struct_size(void)
{
	return add_size(nodes_size(), mul_size(pgjq_max_databases, sizeof(RingDb)));
}

Size
pgjq_ring_shmem_size(void)
{
	Size		s = struct_size();

	s = add_size(s, hash_estimate_size(pgjq_ring_max_in_flight, sizeof(RingFlight)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_lanes, sizeof(RingLane)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_queues, sizeof(RingQueue)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_lanes, sizeof(RingPrio)));
	s = add_size(s, hash_estimate_size(pgjq_ring_max_holds, sizeof(RingHold)));
	s = add_size(s, ring_rates_shmem_size());
	return s;
}

/*
 * The key_rate buckets (key_rate.c takes from them and settles the lanes):
 * their table and the heap of their wake-ups are here with the rest of the
 * ring's shared memory, since a lane asks them whether it is held back.
 */
HTAB	   *ring_rates = NULL;
RingRateHeap *ring_rate_heap = NULL;

Size
ring_rates_shmem_size(void)
{
	Size		s = hash_estimate_size(pgjq_ring_max_rate_keys, sizeof(RingRate));

	return add_size(s, add_size(offsetof(RingRateHeap, w),
								mul_size(pgjq_ring_max_rate_keys, sizeof(RingRateWake))));
}

void
ring_rates_shmem_init(void)
{
	HASHCTL		info;
	bool		found;

	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingHoldKey);
	info.entrysize = sizeof(RingRate);
	ring_rates = ShmemInitHash("pgjq ring key rates", pgjq_ring_max_rate_keys,
							   pgjq_ring_max_rate_keys, &info,
							   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ring_rate_heap = ShmemInitStruct("pgjq ring key rate wake-ups",
									 add_size(offsetof(RingRateHeap, w),
											  mul_size(pgjq_ring_max_rate_keys, sizeof(RingRateWake))),
									 &found);
	if (!found)
	{
		ring_rate_heap->throttled = 0;
		ring_rate_heap->n = 0;
	}
}

bool
ring_rates_any(void)
{
	return ring_rate_heap != NULL && ring_rate_heap->throttled > 0;
}

bool
ring_rate_throttled(const RingLaneKey *lk, TimestampTz now)
{
	RingHoldKey k;
	RingRate   *r;

	if (ring_rate_heap == NULL || ring_rate_heap->throttled == 0)
		return false;
	memset(&k, 0, sizeof(k));
	k.dbid = lk->dbid;
	k.queue_id = lk->queue_id;
	k.keyhash = lk->keyhash;
	r = hash_search(ring_rates, &k, HASH_FIND, NULL);
	return r != NULL && r->throttled_until > now;
}

void
ring_rates_clear(Oid dbid, int32 queue_id)
{
	HASH_SEQ_STATUS hs;
	RingRate   *r;

	if (ring_rates == NULL)
		return;
	hash_seq_init(&hs, ring_rates);
	while ((r = hash_seq_search(&hs)) != NULL)
		if (r->key.dbid == dbid && (queue_id == 0 || r->key.queue_id == queue_id))
		{
			if (r->throttled_until != 0)
			{
				r->throttled_until = 0;
				ring_rate_heap->throttled--;
			}
			hash_search(ring_rates, &r->key, HASH_REMOVE, NULL);
		}
}

/*
 * The in-flight table's hash: the id itself (mixed with the database in the
 * high bits), not tag_hash.  Ids come from a sequence and a claim takes
 * neighbours, so its jobs land in neighbouring buckets: the ten entries of
 * a claim(10) share a cache line or two of the bucket array instead of
 * missing the cache (and, in a new backend, faulting a page in) once each.
 * perf on a D1 drain: with tag_hash's random buckets ring_flight_enter was
 * 3.9% of all backend CPU, mostly the bucket load, under the ring's
 * exclusive lock (docs/benchmarks.md, "The in-flight table's hash").
 */
static uint32
flight_hash(const void *key, Size keysize)
{
	const RingFlightKey *k = (const RingFlightKey *) key;
	uint64		h = (uint64) k->id + (uint64) k->dbid * UINT64CONST(0x9E3779B97F4A7C15);

	return (uint32) (h ^ (h >> 32));
}

/* Called by shmem.c's startup hook, holding AddinShmemInitLock. */
void
pgjq_ring_shmem_init(bool found_unused)
{
	bool		found;
	HASHCTL		info;

	ring = ShmemInitStruct("pgjq ring", struct_size(), &found);
	if (!found)
	{
		memset(ring, 0, offsetof(RingShared, nodes));
		ring->lock = &(GetNamedLWLockTranche("pgjq"))[4].lock;
		for (int i = 0; i < pgjq_ring_positions; i++)
			ring->nodes[i].p.id = 0;
		for (int i = 0; i < pgjq_ring_positions; i++)
			ring->nodes[i].next = (i + 1 < pgjq_ring_positions) ? i + 1 : -1;
		ring->free_head = pgjq_ring_positions > 0 ? 0 : -1;
		ring->ndbs = pgjq_max_databases;
		ring->dbs = (RingDb *) ((char *) ring + nodes_size());
		memset(ring->dbs, 0, sizeof(RingDb) * ring->ndbs);
	}
	/* hard bounds: a full table refuses the call that needs an entry */
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingFlightKey);
	info.entrysize = sizeof(RingFlight);
	info.hash = flight_hash;
	ring_flights = ShmemInitHash("pgjq ring in-flight", pgjq_ring_max_in_flight,
								 pgjq_ring_max_in_flight, &info,
								 HASH_ELEM | HASH_FUNCTION | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingLaneKey);
	info.entrysize = sizeof(RingLane);
	ring_lanes = ShmemInitHash("pgjq ring lanes", pgjq_ring_max_lanes, pgjq_ring_max_lanes,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingQueueKey);
	info.entrysize = sizeof(RingQueue);
	ring_queues = ShmemInitHash("pgjq ring queues", pgjq_ring_max_queues, pgjq_ring_max_queues,
								&info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	/* a priority exists only with a lane of it: never more than lanes */
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingPrioKey);
	info.entrysize = sizeof(RingPrio);
	ring_prios = ShmemInitHash("pgjq ring priorities", pgjq_ring_max_lanes, pgjq_ring_max_lanes,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(RingHoldKey);
	info.entrysize = sizeof(RingHold);
	ring_holds = ShmemInitHash("pgjq ring held keys", pgjq_ring_max_holds, pgjq_ring_max_holds,
							   &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	ring_rates_shmem_init();
}

void
pgjq_ring_require(void)
{
	if (ring == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the ring engine needs pgjq in shared_preload_libraries"),
				 errhint("Add pgjq to shared_preload_libraries and restart the server.")));
}

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

/*
 * The lane a claim takes its next job from: the head of the most urgent
 * priority's ring, which then turns to the next lane.  NULL when the queue
 * has no ready job.
 */
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
 * transaction-local state and the callbacks
 * --------------------------------------------------------------------- */
static RingPendingEnq *p_enq = NULL;
static int	n_enq = 0,
			max_enq = 0;
static RingPendingId *p_claim = NULL;
static int	n_claim = 0,
			max_claim = 0;
static RingPendingId *p_close = NULL;
static int	n_close = 0,
			max_close = 0;

/*
 * Ready positions this transaction took out of their lanes for purge or
 * drop_queue: gone when it commits, back at the front of their lanes if it
 * aborts.  Their lanes stay pinned and their nodes reserved until then, so
 * the abort cannot fail.  (Unlike claims they need no in-flight entry, so a
 * purge of millions of jobs is bounded by nothing but local memory.)
 */
static RingPendingEnq *p_drop = NULL;
static int	n_drop = 0,
			max_drop = 0;

/*
 * Leases this transaction extended (heartbeat) and cancellations it
 * requested: the entry is EXTENDING (was_open) or this transaction's own
 * claim, and takes lease_until (the last extension of a job wins) or the
 * request when this commits.
 */
typedef struct RingPendingExt
{
	int64		id;
	int64		token;
	TimestampTz lease_until;
	bool		was_open;		/* it made the entry EXTENDING */
	bool		cancel;			/* a cancellation request, not a new lease */
	int			level;
} RingPendingExt;
static RingPendingExt *p_ext = NULL;
static int	n_ext = 0,
			max_ext = 0;

/* queues whose table_maybe flag this transaction sets when it ends */
typedef struct TableTouch
{
	int32		queue_id;
	bool		at_commit_only;
	int			level;
} TableTouch;
static TableTouch *p_touch = NULL;
static int	n_touch = 0,
			max_touch = 0;

/*
 * Jobs whose bodies this transaction copied out of the oldest slot
 * (ring_store.c's relocation): when it commits, their lane node or in-flight
 * entry moves to the copy (see apply_relocation).
 */
typedef struct RingPendingReloc
{
	int64		id;
	int32		node;			/* its lane node when copied, -1 if in flight */
	uint16		from;
	RingPos		to;
	int64		token;			/* in flight: its claim, whose 'c' row was */
	ItemPointerData claim_tid;	/* written again at claim_tid of slot to.slot */
	int			level;
} RingPendingReloc;
static RingPendingReloc *p_reloc = NULL;
static int	n_reloc = 0,
			max_reloc = 0;

/* queues whose limits this transaction changed: lanes unparked at commit */
typedef struct Unpark
{
	int32		queue_id;
	int			level;
} Unpark;
static Unpark *p_unpark = NULL;
static int	n_unpark = 0,
			max_unpark = 0;

/*
 * Shared records this transaction gives back when it commits: a dropped
 * queue's (queue_id set), or everything of a database whose database or
 * extension it drops (queue_id 0).
 */
typedef struct Forget
{
	Oid			dbid;
	int32		queue_id;
	int			level;
} Forget;
static Forget *p_forget = NULL;
static int	n_forget = 0,
			max_forget = 0;

static bool my_writer[RING_NSLOTS];
static bool any_writer = false;

/* the 'g' rows this transaction wrote: the generation, and the level */
static uint64 my_marker[RING_NSLOTS];
static int	my_marker_level[RING_NSLOTS];
static int64 my_reserved = 0;
static int	my_truncating = -1;
static int	my_truncating_level = 0;

/* the earliest lease of claims made open again here (see the header) */
static TimestampTz reopened_due = DT_NOEND;

/* lock held: f is open again; its lease end wakes the worker after the lock */
static inline void
reopened(const RingFlight *f)
{
	if (f->lease_until != 0 && f->lease_until < reopened_due)
		reopened_due = f->lease_until;
}

/* lock released: wake the worker for the claims made open again */
static void
wake_for_reopened(void)
{
	if (reopened_due != DT_NOEND)
		pgjq_shmem_wake_worker_at(reopened_due);
	reopened_due = DT_NOEND;
}

static void *
grow(void *arr, int *max, int need, Size elem)
{
	int			newmax = *max == 0 ? 64 : *max;

	if (need <= *max)
		return arr;
	while (newmax < need)
		newmax *= 2;
	arr = arr == NULL ? MemoryContextAlloc(TopMemoryContext, newmax * elem)
		: repalloc(arr, newmax * elem);
	*max = newmax;
	return arr;
}

/* Room for so many more local records, before anything shared moves. */
void
ring_reserve_local(int nenq, int nclaim, int nclose)
{
	p_enq = grow(p_enq, &max_enq, n_enq + nenq, sizeof(RingPendingEnq));
	p_claim = grow(p_claim, &max_claim, n_claim + nclaim, sizeof(RingPendingId));
	p_close = grow(p_close, &max_close, n_close + nclose, sizeof(RingPendingId));
}

/*
 * alter_queue changed the queue's limits: when this commits, lanes parked at
 * the old key limit go back into their rings (a claim parks them again if
 * their key is still full).
 */
void
pgjq_ring_queue_altered(int32 queue_id)
{
	if (ring == NULL)
		return;
	p_unpark = grow(p_unpark, &max_unpark, n_unpark + 1, sizeof(Unpark));
	p_unpark[n_unpark].queue_id = queue_id;
	p_unpark[n_unpark].level = GetCurrentTransactionNestLevel();
	n_unpark++;
}

/* drop_queue: the queue's record goes when this commits (lock not held) */
void
ring_note_queue_dropped(int32 queue_id)
{
	p_forget = grow(p_forget, &max_forget, n_forget + 1, sizeof(Forget));
	p_forget[n_forget].dbid = MyDatabaseId;
	p_forget[n_forget].queue_id = queue_id;
	p_forget[n_forget].level = GetCurrentTransactionNestLevel();
	n_forget++;
}

/*
 * DROP DATABASE, DROP EXTENSION pgjq: the database's ring state (its
 * positions, lanes, queues, in-flight entries, held keys) goes when this
 * commits.  Nobody else has ring work in it then: DROP DATABASE waits for
 * its sessions to end, DROP EXTENSION for every transaction that wrote to
 * the ring's tables, and both take their locks before this is noted.
 */
static object_access_hook_type prev_object_access_hook = NULL;

static void
object_access(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access != OAT_DROP || ring == NULL)
		return;
	if (classId == DatabaseRelationId ||
		(classId == ExtensionRelationId && objectId == get_extension_oid("pgjq", true)))
	{
		p_forget = grow(p_forget, &max_forget, n_forget + 1, sizeof(Forget));
		p_forget[n_forget].dbid = classId == DatabaseRelationId ? objectId : MyDatabaseId;
		p_forget[n_forget].queue_id = 0;
		p_forget[n_forget].level = GetCurrentTransactionNestLevel();
		n_forget++;
	}
}

/* lock held, at commit: give back what this transaction dropped */
static void
apply_forget(void)
{
	for (int i = 0; i < n_forget; i++)
	{
		if (p_forget[i].queue_id != 0)
		{
			ring_queue_forget(p_forget[i].dbid, p_forget[i].queue_id);
			continue;
		}
		for (int d = 0; d < ring->ndbs; d++)
			if (ring->dbs[d].dbid == p_forget[i].dbid)
			{
				ring_clear_db(&ring->dbs[d]);
				memset(&ring->dbs[d], 0, sizeof(RingDb));
			}
	}
}

void
ring_reserve_relocated(int n)
{
	p_reloc = grow(p_reloc, &max_reloc, n_reloc + n, sizeof(RingPendingReloc));
}

/* room reserved by ring_reserve_relocated */
void
ring_note_relocated(int64 id, int32 node, int from, const RingPos *to,
					int64 token, const ItemPointerData *claim_tid)
{
	RingPendingReloc *r = &p_reloc[n_reloc++];

	r->id = id;
	r->node = node;
	r->from = (uint16) from;
	r->to = *to;
	r->token = claim_tid ? token : 0;
	if (claim_tid)
		r->claim_tid = *claim_tid;
	r->level = GetCurrentTransactionNestLevel();
}

/*
 * Lock held: a job of slot s finished or moved to another slot, in
 * transaction xid, which is committing now or has committed
 * (InvalidTransactionId: unknown, so every xid assigned so far stands for
 * it).
 */
static void
slot_left(RingDb *db, int s, TransactionId xid)
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
static void
flight_take_reloc(RingDb *db, RingFlight *f)
{
	if (f->reloc_slot == RING_NO_SLOT)
		return;
	if (db)
	{
		/* when the relocation that copied it committed */
		slot_left(db, f->slot, f->reloc_xid);
		db->slots[f->reloc_slot].open++;
	}
	f->tid = f->reloc_tid;
	f->slot = f->reloc_slot;
	f->reloc_slot = RING_NO_SLOT;
}

/*
 * lock held, at commit: every relocated job still where it was copied from
 * moves to its copy, with its slot's count of unfinished jobs.  A ready job
 * is found by its lane node (p.id is 0 on free nodes, and a claim that
 * rolled back may have put it back in another node: then the next
 * relocation copies it again); a job in flight by its entry, at once if
 * nobody is closing or claiming it, else when that transaction ends.  A job
 * found nowhere finished meanwhile: its copy is never read.
 */
static void
apply_relocation(RingDb *db)
{
	for (int i = 0; i < n_reloc; i++)
	{
		RingPendingReloc *r = &p_reloc[i];
		RingFlight *f;

		if (r->node >= 0 && ring->nodes[r->node].p.id == r->id &&
			ring->nodes[r->node].p.slot == r->from)
		{
			ring->nodes[r->node].p.tid = r->to.tid;
			ring->nodes[r->node].p.slot = r->to.slot;
			if (db)
			{
				slot_left(db, r->from, GetTopTransactionIdIfAny());
				db->slots[r->to.slot].open++;
			}
			continue;
		}
		f = ring_flight_find(r->id);
		if (f == NULL || f->slot != r->from)
			continue;
		f->reloc_tid = r->to.tid;
		f->reloc_slot = r->to.slot;
		f->reloc_xid = GetTopTransactionIdIfAny();
		/* the old claim row goes with the old slot: the copy's is the one */
		if (r->token != 0 && f->token == r->token)
		{
			f->claim_tid = r->claim_tid;
			f->claim_slot = r->to.slot;
		}
		if (f->state == RF_OPEN)
			flight_take_reloc(db, f);
	}
}

/* a committed enqueue pushes p to the pinned lane (one reserved node) */
void
ring_note_enqueued(const RingPos *p, RingLane *lane)
{
	Assert(n_enq < max_enq);
	p_enq[n_enq].p = *p;
	p_enq[n_enq].lane = lane;
	p_enq[n_enq].level = GetCurrentTransactionNestLevel();
	p_enq[n_enq].claimed = false;
	n_enq++;
	my_reserved++;
}

/* Does this transaction have jobs of the queue enqueued and not claimed? */
bool
ring_has_own(int32 queue_id)
{
	for (int i = 0; i < n_enq; i++)
		if (!p_enq[i].claimed && p_enq[i].lane->key.queue_id == queue_id)
			return true;
	return false;
}

/* ring_take_own's jobs that could not be claimed after all: pending again */
void
ring_take_own_undo(const RingPos *pos, int n)
{
	for (int k = 0; k < n; k++)
		for (int i = 0; i < n_enq; i++)
			if (p_enq[i].p.id == pos[k].id)
				p_enq[i].claimed = false;
}

/*
 * Lock held: up to max jobs of the queue that this transaction enqueued and
 * has not claimed yet, in enqueue order, marked claimed.  A claim sees its
 * own transaction's jobs, as a claim of pgjq.job sees its own rows; such a
 * job is never in a lane: at commit it is in flight, at abort it is gone.
 */
int
ring_take_own(int32 queue_id, int max, RingPos *out, RingLane **lanes)
{
	int			k = 0;

	for (int i = 0; i < n_enq && k < max; i++)
	{
		if (p_enq[i].claimed || p_enq[i].lane->key.queue_id != queue_id)
			continue;
		p_enq[i].claimed = true;
		out[k] = p_enq[i].p;
		lanes[k] = p_enq[i].lane;
		k++;
	}
	return k;
}

/* lock held: this transaction's own unpublished job id, taken as a claim would */
bool
ring_take_own_id(int64 id, RingPos *out, RingLane **lane)
{
	for (int i = 0; i < n_enq; i++)
		if (p_enq[i].p.id == id && !p_enq[i].claimed)
		{
			p_enq[i].claimed = true;
			*out = p_enq[i].p;
			*lane = p_enq[i].lane;
			return true;
		}
	return false;
}

/* lock held: p was popped from lane for a purge; caller reserved room */
void
ring_note_dropped(const RingPos *p, RingLane *lane)
{
	Assert(n_drop < max_drop);
	p_drop[n_drop].p = *p;
	p_drop[n_drop].lane = lane;
	p_drop[n_drop].level = GetCurrentTransactionNestLevel();
	n_drop++;
	lane->pinned++;
	ring->reserved++;
}

void
ring_reserve_dropped(int n)
{
	p_drop = grow(p_drop, &max_drop, n_drop + n, sizeof(RingPendingEnq));
}

void
ring_note_claimed(int64 id)
{
	Assert(n_claim < max_claim);
	p_claim[n_claim].id = id;
	p_claim[n_claim].level = GetCurrentTransactionNestLevel();
	p_claim[n_claim].was_claiming = false;
	n_claim++;
}

/*
 * Lock held: how many of the queue's jobs being claimed this transaction
 * claims (*mine), and of them how many it enqueued itself (*mine_own), so
 * that counts "as committed" still show a transaction its own claims.
 */
void
ring_own_claiming(int32 queue_id, int64 *mine, int64 *mine_own)
{
	*mine = *mine_own = 0;
	for (int i = 0; i < n_claim; i++)
	{
		RingFlight *f = ring_flight_find(p_claim[i].id);

		if (f != NULL && f->state == RF_CLAIMING && f->queue_id == queue_id &&
			f->xid == GetTopTransactionIdIfAny())
		{
			(*mine)++;
			if (f->pending)
				(*mine_own)++;
		}
	}
}

void
ring_note_closed(int64 id, bool was_claiming, bool was_extending)
{
	Assert(n_close < max_close);
	p_close[n_close].id = id;
	p_close[n_close].level = GetCurrentTransactionNestLevel();
	p_close[n_close].was_claiming = was_claiming;
	p_close[n_close].was_extending = was_extending;
	n_close++;
}

/* Did this transaction request the cancellation of ring job id? */
bool
ring_cancel_requested_here(int64 id)
{
	for (int i = 0; i < n_ext; i++)
		if (p_ext[i].id == id && p_ext[i].cancel)
			return true;
	return false;
}

/* Room for one more extension, before the entry changes. */
void
ring_reserve_extended(void)
{
	p_ext = grow(p_ext, &max_ext, n_ext + 1, sizeof(RingPendingExt));
}

/* lock held; room reserved by ring_reserve_extended */
void
ring_note_extended(int64 id, int64 token, TimestampTz lease_until, bool was_open,
				   bool cancel)
{
	RingPendingExt *e = &p_ext[n_ext++];

	e->id = id;
	e->token = token;
	e->lease_until = lease_until;
	e->was_open = was_open;
	e->cancel = cancel;
	e->level = GetCurrentTransactionNestLevel();
}

/*
 * This transaction writes to the slot, which is not truncated before it
 * ends; true the first time (the caller counts it as a writer).
 */
bool
ring_note_writer(int slot)
{
	if (my_writer[slot])
		return false;
	my_writer[slot] = true;
	any_writer = true;
	return true;
}

/* Has this (sub)transaction written the slot's 'g' row? */
bool
ring_marker_written(int slot)
{
	return my_marker[slot] != 0;
}

/*
 * This transaction wrote the slot's 'g' row of generation gen: at commit
 * the slot counts as marked (if it still has that generation), so later
 * writers need not write one; a subtransaction that rolls back takes it
 * back (subxact_callback).
 */
void
ring_note_marker(int slot, uint64 gen)
{
	my_marker[slot] = gen;
	my_marker_level[slot] = GetCurrentTransactionNestLevel();
}

bool
ring_writing(void)
{
	return any_writer;
}

void
ring_note_truncating(int slot)
{
	my_truncating = slot;
	my_truncating_level = GetCurrentTransactionNestLevel();
}

bool
ring_truncating(void)
{
	return my_truncating >= 0;
}

/*
 * pgjq.job may have ready rows of the queue once this transaction
 * ends (at_commit_only: once it commits): claims must look there again.
 */
void
ring_note_table_touch(int32 queue_id, bool at_commit_only)
{
	for (int i = 0; i < n_touch; i++)
		if (p_touch[i].queue_id == queue_id && p_touch[i].at_commit_only == at_commit_only)
			return;
	p_touch = grow(p_touch, &max_touch, n_touch + 1, sizeof(TableTouch));
	p_touch[n_touch].queue_id = queue_id;
	p_touch[n_touch].at_commit_only = at_commit_only;
	p_touch[n_touch].level = GetCurrentTransactionNestLevel();
	n_touch++;
}

/* Did this transaction make ready rows of the queue in pgjq.job? */
bool
ring_touched_here(int32 queue_id)
{
	for (int i = 0; i < n_touch; i++)
		if (p_touch[i].queue_id == queue_id && p_touch[i].at_commit_only)
			return true;
	return false;
}

static void
reset_local(void)
{
	n_enq = n_claim = n_close = n_touch = n_drop = n_reloc = n_unpark = n_ext = n_forget = 0;
	if (any_writer)
	{
		memset(my_writer, 0, sizeof(my_writer));
		memset(my_marker, 0, sizeof(my_marker));
	}
	any_writer = false;
	my_reserved = 0;
	my_truncating = -1;
}

static bool
has_pending(void)
{
	return n_enq > 0 || n_claim > 0 || n_close > 0 || n_touch > 0 || n_drop > 0 ||
		n_reloc > 0 || n_unpark > 0 || n_ext > 0 || n_forget > 0 || any_writer ||
		my_truncating >= 0;
}

/* lock held: set the table flag of the touched queues (commit or not) */
static void
touch_tables(bool commit, int from)
{
	for (int i = 0; i < n_touch; i++)
	{
		RingQueue  *q;

		if (p_touch[i].level < from || (!commit && p_touch[i].at_commit_only))
			continue;
		q = ring_queue_get(p_touch[i].queue_id, false);
		if (q != NULL)
		{
			/* a missing record starts with the flag set */
			q->table_maybe = true;
			q->table_gen++;
		}
	}
}

/*
 * Does a queue this transaction touched have a ring record?  (A queue
 * without one needs nothing: a new record starts with table_maybe set.)
 */
static bool
touches_ring_queue(void)
{
	bool		any = false;

	LWLockAcquire(ring->lock, LW_SHARED);
	for (int i = 0; i < n_touch && !any; i++)
		any = ring_queue_get(p_touch[i].queue_id, false) != NULL;
	LWLockRelease(ring->lock);
	return any;
}

/* lock held: the claim of f committed or went away (RingQueue.claiming) */
static void
claim_ended(RingFlight *f)
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

/* lock held: give back claims with level >= from, newest first */
static void
undo_claims(int from)
{
	int			keep = 0;

	for (int i = n_claim - 1; i >= 0; i--)
	{
		RingFlight *f;
		RingLane   *l;
		RingPos		p;

		if (p_claim[i].level < from)
			continue;
		f = ring_flight_find(p_claim[i].id);
		if (f == NULL || f->state != RF_CLAIMING)
			continue;			/* cannot happen; never fail here */
		claim_ended(f);
		if (f->pending)
		{
			/* its own enqueue: pending again if that still stands */
			for (int j = 0; j < n_enq; j++)
				if (p_enq[j].p.id == f->key.id)
					p_enq[j].claimed = false;
			l = f->lane;
			l->running--;
			l->queue->running--;
			ring_flight_remove(p_claim[i].id);
			ring_lane_settle(l);
			continue;
		}
		flight_take_reloc(ring_db_find(), f);
		p.id = f->key.id;
		p.enqueued_at = f->enqueued_at;
		p.tid = f->tid;
		p.slot = f->slot;
		l = f->lane;
		/* the node of the claim went back to the pool: there is room */
		ring_lane_push_front(l, &p);
		l->running--;
		l->queue->running--;
		ring_lane_settle(l);
		ring_flight_remove(p_claim[i].id);
		ring->held--;
	}
	for (int i = 0; i < n_claim; i++)
		if (p_claim[i].level < from)
			p_claim[keep++] = p_claim[i];
	n_claim = keep;
}

/* lock held: reopen closes with level >= from */
static void
undo_closes(int from)
{
	int			keep = 0;

	for (int i = 0; i < n_close; i++)
	{
		RingFlight *f;

		if (p_close[i].level < from)
		{
			p_close[keep++] = p_close[i];
			continue;
		}
		f = ring_flight_find(p_close[i].id);
		if (f != NULL && f->state == RF_CLOSING)
		{
			if (p_close[i].was_claiming)
				f->state = RF_CLAIMING; /* undo_claims sees it next */
			else if (p_close[i].was_extending)
				f->state = RF_EXTENDING;	/* undo_extends sees it next */
			else
			{
				f->state = RF_OPEN;
				f->xid = InvalidTransactionId;
				flight_take_reloc(ring_db_find(), f);
				reopened(f);
			}
		}
	}
	n_close = keep;
}

/*
 * lock held: forget extensions with level >= from; an entry this
 * transaction made EXTENDING with one of them is open again, with its lease
 * as it was
 */
static void
undo_extends(int from)
{
	int			keep = 0;

	for (int i = 0; i < n_ext; i++)
	{
		RingFlight *f;

		if (p_ext[i].level < from)
		{
			p_ext[keep++] = p_ext[i];
			continue;
		}
		if (!p_ext[i].was_open)
			continue;
		f = ring_flight_find(p_ext[i].id);
		if (f != NULL && f->state == RF_EXTENDING)
		{
			f->state = RF_OPEN;
			f->xid = InvalidTransactionId;
			flight_take_reloc(ring_db_find(), f);
			reopened(f);
		}
	}
	n_ext = keep;
}

/* lock held: purged positions with level >= from go back, newest first */
static void
undo_drops(int from)
{
	int			keep = 0;

	for (int i = n_drop - 1; i >= 0; i--)
	{
		RingLane   *l = p_drop[i].lane;

		if (p_drop[i].level < from)
			continue;
		ring->reserved--;		/* the reserved node takes it back */
		ring_lane_push_front(l, &p_drop[i].p);
		l->pinned--;
		ring_lane_settle(l);
	}
	for (int i = 0; i < n_drop; i++)
		if (p_drop[i].level < from)
			p_drop[keep++] = p_drop[i];
	n_drop = keep;
}

/* lock held: producers' positions with level >= from are never published */
static void
undo_enqueues(int from)
{
	int			keep = 0;

	for (int i = 0; i < n_enq; i++)
	{
		if (p_enq[i].level < from)
		{
			p_enq[keep++] = p_enq[i];
			continue;
		}
		p_enq[i].lane->pinned--;
		ring_lane_settle(p_enq[i].lane);
		ring->reserved--;
		my_reserved--;
	}
	n_enq = keep;
}

static void
xact_callback(XactEvent event, void *arg)
{
	RingDb	   *db;

	if (ring == NULL || !has_pending())
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:

			/*
			 * a prepared DROP EXTENSION leaves the ring's state to the
			 * rebuild of a re-created extension (no commit callback here)
			 */
			n_forget = 0;
			if (!has_pending())
				break;
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that enqueued, claimed or finished jobs of a ring queue"),
					 errdetail("The ring engine publishes a transaction's jobs when it commits in the session that ran it.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			pgjq_crash_point("commit");
			/* nothing of the ring's, no ready row in pgjq.job: nothing to do */
			if (n_enq == 0 && n_claim == 0 && n_close == 0 && n_drop == 0 && n_reloc == 0 &&
				n_unpark == 0 && n_ext == 0 && !any_writer &&
				my_truncating < 0 && !touches_ring_queue())
			{
				/* a drop of a queue, a database or the extension, alone */
				if (n_forget > 0)
				{
					LWLockAcquire(ring->lock, LW_EXCLUSIVE);
					apply_forget();
					LWLockRelease(ring->lock);
				}
				reset_local();
				break;
			}
			LWLockAcquire(ring->lock, LW_EXCLUSIVE);
			db = ring_db();
			for (int i = 0; i < n_enq; i++)
			{
				RingLane   *l = p_enq[i].lane;

				/* a job this transaction claimed is in flight, not ready */
				if (!p_enq[i].claimed)
					ring_lane_push_back(l, &p_enq[i].p);
				l->pinned--;
				ring_lane_settle(l);
				if (db)
					db->slots[p_enq[i].p.slot].open++;
			}
			ring->reserved -= my_reserved;
			for (int s = 0; s < RING_NSLOTS && db; s++)
			{
				if (my_writer[s])
					db->slots[s].writers--;
				/* its 'g' row is durable now: the slot's order is known */
				if (my_marker[s] != 0 && db->slots[s].gen == my_marker[s])
					db->slots[s].marked = true;
			}
			for (int i = 0; i < n_claim; i++)
			{
				RingFlight *f = ring_flight_find(p_claim[i].id);

				if (f != NULL && f->state == RF_CLAIMING)
				{
					f->state = RF_OPEN;
					f->xid = InvalidTransactionId;
					if (!f->pending)
						ring->held--;
					claim_ended(f);
					f->pending = false;
					flight_take_reloc(db, f);
				}
			}
			for (int i = 0; i < n_close; i++)
			{
				RingFlight *f = ring_flight_find(p_close[i].id);

				if (f != NULL && f->state == RF_CLOSING)
				{
					RingLane   *l = f->lane;

					if (db)
						slot_left(db, f->slot, GetTopTransactionIdIfAny());
					l->running--;
					l->queue->running--;
					if (p_close[i].was_claiming)
						claim_ended(f);
					if (p_close[i].was_claiming && !f->pending)
						ring->held--;
					ring_flight_remove(p_close[i].id);
					ring_lane_settle(l);
				}
			}
			/* after the claims: a job claimed here is open now */
			for (int i = 0; i < n_ext; i++)
			{
				RingFlight *f = ring_flight_find(p_ext[i].id);

				if (f == NULL || f->token != p_ext[i].token ||
					!(f->state == RF_OPEN || f->state == RF_EXTENDING))
					continue;	/* closed here after its heartbeat */
				if (p_ext[i].cancel)
					f->cancel_requested = true;
				else
					f->lease_until = p_ext[i].lease_until;
				if (f->state == RF_EXTENDING)
				{
					f->state = RF_OPEN;
					f->xid = InvalidTransactionId;
					flight_take_reloc(db, f);
					reopened(f);
				}
			}
			for (int i = 0; i < n_drop; i++)
			{
				RingLane   *l = p_drop[i].lane;

				if (db)
					slot_left(db, p_drop[i].p.slot, GetTopTransactionIdIfAny());
				ring->reserved--;
				l->pinned--;
				ring_lane_settle(l);
			}
			touch_tables(true, 0);
			apply_relocation(db);
			for (int i = 0; i < n_unpark; i++)
			{
				RingQueue  *q = ring_queue_get(p_unpark[i].queue_id, false);

				if (q != NULL)
					ring_queue_unpark_all(q);
			}
			if (my_truncating >= 0 && db)
			{
				RingSlot   *st = &db->slots[my_truncating];

				st->truncating = false;
				st->sealed = false;
				st->clean = true;
				st->appended = 0;
				st->gen = 0;
				st->marked = false;
				db->truncations++;
				db->stalled = false;
			}
			/* last: it may clear this database's record */
			apply_forget();
			LWLockRelease(ring->lock);
			wake_for_reopened();
			reset_local();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			LWLockAcquire(ring->lock, LW_EXCLUSIVE);
			db = ring_db();
			undo_enqueues(0);
			ring->reserved -= my_reserved;
			for (int s = 0; s < RING_NSLOTS && db; s++)
				if (my_writer[s])
					db->slots[s].writers--;
			undo_closes(0);
			undo_extends(0);
			undo_claims(0);
			undo_drops(0);
			touch_tables(false, 0);
			if (my_truncating >= 0 && db)
				db->slots[my_truncating].truncating = false;
			LWLockRelease(ring->lock);
			wake_for_reopened();
			reset_local();
			break;
		default:
			break;
	}
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	int			level;

	if (ring == NULL || !has_pending())
		return;
	level = GetCurrentTransactionNestLevel();
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		int			keep = 0;

		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
		undo_enqueues(level);
		undo_closes(level);
		undo_extends(level);
		undo_claims(level);
		undo_drops(level);
		touch_tables(false, level);
		for (int i = 0; i < n_touch; i++)
			if (p_touch[i].level < level)
				p_touch[keep++] = p_touch[i];
		n_touch = keep;
		keep = 0;
		for (int i = 0; i < n_reloc; i++)
			if (p_reloc[i].level < level)
				p_reloc[keep++] = p_reloc[i];
		n_reloc = keep;
		keep = 0;
		for (int i = 0; i < n_unpark; i++)
			if (p_unpark[i].level < level)
				p_unpark[keep++] = p_unpark[i];
		n_unpark = keep;
		/* a 'g' row written at this level is gone: a later write rewrites it */
		for (int s = 0; s < RING_NSLOTS; s++)
			if (my_marker[s] != 0 && my_marker_level[s] >= level)
				my_marker[s] = 0;
		keep = 0;
		for (int i = 0; i < n_forget; i++)
			if (p_forget[i].level < level)
				p_forget[keep++] = p_forget[i];
		n_forget = keep;
		if (my_truncating >= 0 && my_truncating_level >= level)
		{
			RingDb	   *db = ring_db();

			if (db)
				db->slots[my_truncating].truncating = false;
			my_truncating = -1;
		}
		LWLockRelease(ring->lock);
		wake_for_reopened();
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (int i = 0; i < n_enq; i++)
			if (p_enq[i].level >= level)
				p_enq[i].level = level - 1;
		for (int i = 0; i < n_claim; i++)
			if (p_claim[i].level >= level)
				p_claim[i].level = level - 1;
		for (int i = 0; i < n_close; i++)
			if (p_close[i].level >= level)
				p_close[i].level = level - 1;
		for (int i = 0; i < n_ext; i++)
			if (p_ext[i].level >= level)
				p_ext[i].level = level - 1;
		for (int i = 0; i < n_touch; i++)
			if (p_touch[i].level >= level)
				p_touch[i].level = level - 1;
		for (int i = 0; i < n_drop; i++)
			if (p_drop[i].level >= level)
				p_drop[i].level = level - 1;
		for (int i = 0; i < n_reloc; i++)
			if (p_reloc[i].level >= level)
				p_reloc[i].level = level - 1;
		for (int i = 0; i < n_unpark; i++)
			if (p_unpark[i].level >= level)
				p_unpark[i].level = level - 1;
		for (int i = 0; i < n_forget; i++)
			if (p_forget[i].level >= level)
				p_forget[i].level = level - 1;
		if (my_truncating >= 0 && my_truncating_level >= level)
			my_truncating_level = level - 1;
		for (int s = 0; s < RING_NSLOTS; s++)
			if (my_marker[s] != 0 && my_marker_level[s] >= level)
				my_marker_level[s] = level - 1;
	}
}

/*
 * pgjq.job got ready rows of a queue (an enqueue the ring had no room for,
 * a promotion likewise, retry of a dead job): the queue's claims must look
 * there again once this transaction commits.
 */
void
pgjq_ring_became_ready(int32 queue_id, int n)
{
	if (n > 0)
		ring_note_table_touch(queue_id, true);
}

/* Called from _PG_init (preloaded only). */
void
pgjq_ring_startup(void)
{
	RegisterXactCallback(xact_callback, NULL);
	RegisterSubXactCallback(subxact_callback, NULL);
	prev_object_access_hook = object_access_hook;
	object_access_hook = object_access;
}
