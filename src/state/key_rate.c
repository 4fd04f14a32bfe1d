/*-------------------------------------------------------------------------
 *
 * key_rate.c
 *	  Per-key rate limits of ring claims: key_rate (claims per second per
 *	  fair key) and key_burst on create_queue/alter_queue.
 *
 * Each fair key of a queue with key_rate has a token bucket, one entry of
 * the shared ring_rates table (pgjq.ring_max_rate_keys entries), kept and
 * changed under ring->lock exclusively, so it is exact across every backend:
 * a claim takes a key's next job only if the bucket holds a whole token, and
 * spends it (ring_rate_take).  A key whose bucket is empty is throttled
 * until its next token: its lanes leave their queue's round robin
 * (ring_lane_held says so, as for a held key), and the time goes into a
 * min-heap of wake-ups, so the next claim after that time puts them back
 * (ring_rates_expire_due, one unlocked read when nothing is throttled) and
 * a waiting claim sleeps no longer than until then (pgjq_ring_hold_next).
 * A claim is O(batch) however many keys are throttled.
 *
 * A token is spent when the claim takes the job, as the queue's rate spends
 * its tokens: a claim that rolls back does not give it back (the rate
 * limits how often claims start).  Buckets live in shared memory only: after
 * a restart every key's bucket starts full.  An entry goes when the table
 * needs room and its bucket has refilled (a full bucket is what a new entry
 * starts with); a claim that needs an entry when none can go takes nothing
 * more and, if it took nothing, fails (54000) with a hint.
 *
 * Locking: everything here runs under ring->lock (exclusive for changes),
 * the lock the claim loop holds.
 *
 *-------------------------------------------------------------------------
 */
#include "state/ring_internal.h"

#include <math.h>

#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

typedef struct RingRate
{
	RingHoldKey key;			/* dbid, queue, lane hash of the key */
	double		tokens;			/* as of refilled */
	TimestampTz refilled;
	double		rate;			/* the queue's key_rate when last taken from */
	double		burst;
	TimestampTz throttled_until;	/* 0: not throttled */
} RingRate;

typedef struct RingRateWake
{
	TimestampTz at;
	RingHoldKey key;
} RingRateWake;

typedef struct RingRateHeap
{
	int64		throttled;		/* entries with throttled_until != 0 */
	int32		n;
	RingRateWake w[FLEXIBLE_ARRAY_MEMBER];	/* a min-heap on at */
} RingRateHeap;

static HTAB *ring_rates = NULL;
static RingRateHeap *heap = NULL;

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
	heap = ShmemInitStruct("pgjq ring key rate wake-ups",
						   add_size(offsetof(RingRateHeap, w),
									mul_size(pgjq_ring_max_rate_keys, sizeof(RingRateWake))),
						   &found);
	if (!found)
	{
		heap->throttled = 0;
		heap->n = 0;
	}
}

/* ---------------------------------------------------------------------
 * the heap of wake-ups (one per throttled entry: never more than entries)
 * --------------------------------------------------------------------- */

static void
heap_push(TimestampTz at, const RingHoldKey *key)
{
	int			i = heap->n++;

	while (i > 0)
	{
		int			parent = (i - 1) / 2;

		if (heap->w[parent].at <= at)
			break;
		heap->w[i] = heap->w[parent];
		i = parent;
	}
	heap->w[i].at = at;
	heap->w[i].key = *key;
}

/*
 * A throttled entry's wake-up.  Wake-ups of throttles that ended early stay
 * in the heap until their time; when they fill it, it is made again from
 * the throttled entries (at most one each, and the table's size bounds
 * them).
 */
static void
wake_add(RingRate *r)
{
	HASH_SEQ_STATUS hs;
	RingRate   *e;

	if (heap->n < pgjq_ring_max_rate_keys)
	{
		heap_push(r->throttled_until, &r->key);
		return;
	}
	heap->n = 0;
	hash_seq_init(&hs, ring_rates);
	while ((e = hash_seq_search(&hs)) != NULL)
		if (e->throttled_until != 0)
			heap_push(e->throttled_until, &e->key);
}

static void
heap_pop(void)
{
	RingRateWake last = heap->w[--heap->n];
	int			i = 0;

	for (;;)
	{
		int			c = 2 * i + 1;

		if (c >= heap->n)
			break;
		if (c + 1 < heap->n && heap->w[c + 1].at < heap->w[c].at)
			c++;
		if (last.at <= heap->w[c].at)
			break;
		heap->w[i] = heap->w[c];
		i = c;
	}
	if (heap->n > 0)
		heap->w[i] = last;
}

/* ---------------------------------------------------------------------
 * buckets
 * --------------------------------------------------------------------- */

static double
burst_of(const PgjqQueue *queue)
{
	return queue->key_burst > 0 ? queue->key_burst : Max(1.0, ceil(queue->key_rate));
}

static double
tokens_at(const RingRate *r, TimestampTz now)
{
	if (now <= r->refilled)
		return r->tokens;
	return Min(r->burst, r->tokens + r->rate * (double) (now - r->refilled) / USECS_PER_SEC);
}

/* Entries whose bucket is full again out of the table; returns how many. */
static int
evict_full(TimestampTz now)
{
	HASH_SEQ_STATUS hs;
	RingRate   *r;
	int			n = 0;

	hash_seq_init(&hs, ring_rates);
	while ((r = hash_seq_search(&hs)) != NULL)
		if (r->throttled_until == 0 && tokens_at(r, now) >= r->burst)
		{
			hash_search(ring_rates, &r->key, HASH_REMOVE, NULL);
			n++;
		}
	return n;
}

/* The lanes of a key of any database where they belong now. */
static void
settle_key(const RingHoldKey *k)
{
	RingQueueKey qk;
	RingQueue  *q;

	memset(&qk, 0, sizeof(qk));
	qk.dbid = k->dbid;
	qk.queue_id = k->queue_id;
	q = hash_search(ring_queues, &qk, HASH_FIND, NULL);
	if (q == NULL)
		return;
	for (RingPrio *r = q->prios, *next; r != NULL; r = next)
	{
		RingLaneKey lk;
		RingLane   *l;

		/* settling the lane may drop its priority's ring */
		next = r->next;
		memset(&lk, 0, sizeof(lk));
		lk.dbid = k->dbid;
		lk.queue_id = k->queue_id;
		lk.keyhash = k->keyhash;
		lk.priority = r->key.priority;
		l = hash_search(ring_lanes, &lk, HASH_FIND, NULL);
		if (l != NULL)
			ring_lane_settle(l);
	}
}

/* the throttle of one entry ends (lock held exclusively) */
static void
unthrottle(RingRate *r)
{
	RingHoldKey k = r->key;

	r->throttled_until = 0;
	heap->throttled--;
	settle_key(&k);
}

int
ring_rate_take(const PgjqQueue *queue, uint64 keyhash, TimestampTz now)
{
	RingHoldKey k;
	RingRate   *r;
	bool		found;

	memset(&k, 0, sizeof(k));
	k.dbid = MyDatabaseId;
	k.queue_id = queue->queue_id;
	k.keyhash = keyhash;
	r = hash_search(ring_rates, &k, HASH_ENTER_NULL, &found);
	if (r == NULL && evict_full(now) > 0)
		r = hash_search(ring_rates, &k, HASH_ENTER_NULL, &found);
	if (r == NULL)
		return -1;
	if (!found)
	{
		r->rate = queue->key_rate;
		r->burst = burst_of(queue);
		r->tokens = r->burst;
		r->refilled = now;
		r->throttled_until = 0;
	}
	if (r->throttled_until > now)
		return 0;
	if (r->throttled_until != 0)
		unthrottle(r);			/* its wake-up was not taken yet */
	r->tokens = tokens_at(r, now);
	r->refilled = now;
	/* settings as they are now (alter_queue) */
	r->rate = queue->key_rate;
	r->burst = burst_of(queue);
	r->tokens = Min(r->tokens, r->burst);
	if (r->tokens >= 1)
		return 1;
	/* out until its next token */
	r->throttled_until = now + (int64) ceil((1 - r->tokens) / r->rate * USECS_PER_SEC);
	heap->throttled++;
	wake_add(r);
	settle_key(&k);
	return 0;
}

void
ring_rate_spend(const PgjqQueue *queue, uint64 keyhash)
{
	RingHoldKey k;
	RingRate   *r;

	memset(&k, 0, sizeof(k));
	k.dbid = MyDatabaseId;
	k.queue_id = queue->queue_id;
	k.keyhash = keyhash;
	r = hash_search(ring_rates, &k, HASH_FIND, NULL);
	if (r != NULL)
		r->tokens -= 1;
}

bool
ring_rates_any(void)
{
	return heap != NULL && heap->throttled > 0;
}

bool
ring_rate_throttled(const RingLaneKey *lk, TimestampTz now)
{
	RingHoldKey k;
	RingRate   *r;

	if (heap == NULL || heap->throttled == 0)
		return false;
	memset(&k, 0, sizeof(k));
	k.dbid = lk->dbid;
	k.queue_id = lk->queue_id;
	k.keyhash = lk->keyhash;
	r = hash_search(ring_rates, &k, HASH_FIND, NULL);
	return r != NULL && r->throttled_until > now;
}

void
ring_rates_expire_due(void)
{
	TimestampTz now;
	bool		due;

	if (heap == NULL || heap->throttled == 0)
		return;
	now = GetCurrentTimestamp();
	LWLockAcquire(ring->lock, LW_SHARED);
	due = heap->n > 0 && heap->w[0].at <= now;
	LWLockRelease(ring->lock);
	if (!due)
		return;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	while (heap->n > 0 && heap->w[0].at <= now)
	{
		RingHoldKey k = heap->w[0].key;
		TimestampTz at = heap->w[0].at;
		RingRate   *r;

		heap_pop();
		r = hash_search(ring_rates, &k, HASH_FIND, NULL);
		/* an entry that went (its database cleared) left its wake-up here */
		if (r != NULL && r->throttled_until == at)
			unthrottle(r);
	}
	LWLockRelease(ring->lock);
}

TimestampTz
ring_rates_next(void)
{
	if (heap == NULL || heap->n == 0)
		return DT_NOEND;
	return heap->w[0].at;
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
				heap->throttled--;
			}
			hash_search(ring_rates, &r->key, HASH_REMOVE, NULL);
		}
}

void
pgjq_ring_rates_altered(int32 queue_id)
{
	HASH_SEQ_STATUS hs;
	RingRate   *r;

	if (ring == NULL || ring_rates == NULL)
		return;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	hash_seq_init(&hs, ring_rates);
	while ((r = hash_seq_search(&hs)) != NULL)
		if (r->key.dbid == MyDatabaseId && r->key.queue_id == queue_id)
		{
			/* the next claim refills it with the new settings */
			if (r->throttled_until != 0)
				unthrottle(r);
		}
	LWLockRelease(ring->lock);
}
