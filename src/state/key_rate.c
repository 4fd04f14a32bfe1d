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
#include "state/key_rate.h"
#include "state/ring_internal.h"
#include "common/guc.h"

#include <math.h>

#include "miscadmin.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

/* ---------------------------------------------------------------------
 * the heap of wake-ups (one per throttled entry: never more than entries)
 * --------------------------------------------------------------------- */

static void
heap_push(TimestampTz at, const RingHoldKey *key)
{
	int			i = ring_rate_heap->n++;

	while (i > 0)
	{
		int			parent = (i - 1) / 2;

		if (ring_rate_heap->w[parent].at <= at)
			break;
		ring_rate_heap->w[i] = ring_rate_heap->w[parent];
		i = parent;
	}
	ring_rate_heap->w[i].at = at;
	ring_rate_heap->w[i].key = *key;
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

	if (ring_rate_heap->n < pgjq_ring_max_rate_keys)
	{
		heap_push(r->throttled_until, &r->key);
		return;
	}
	ring_rate_heap->n = 0;
	hash_seq_init(&hs, ring_rates);
	while ((e = hash_seq_search(&hs)) != NULL)
		if (e->throttled_until != 0)
			heap_push(e->throttled_until, &e->key);
}

static void
heap_pop(void)
{
	RingRateWake last = ring_rate_heap->w[--ring_rate_heap->n];
	int			i = 0;

	for (;;)
	{
		int			c = 2 * i + 1;

		if (c >= ring_rate_heap->n)
			break;
		if (c + 1 < ring_rate_heap->n && ring_rate_heap->w[c + 1].at < ring_rate_heap->w[c].at)
			c++;
		if (last.at <= ring_rate_heap->w[c].at)
			break;
		ring_rate_heap->w[i] = ring_rate_heap->w[c];
		i = c;
	}
	if (ring_rate_heap->n > 0)
		ring_rate_heap->w[i] = last;
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
	ring_rate_heap->throttled--;
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
	ring_rate_heap->throttled++;
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

void
ring_rates_expire_due(void)
{
	TimestampTz now;
	bool		due;

	if (ring_rate_heap == NULL || ring_rate_heap->throttled == 0)
		return;
	now = GetCurrentTimestamp();
	LWLockAcquire(ring->lock, LW_SHARED);
	due = ring_rate_heap->n > 0 && ring_rate_heap->w[0].at <= now;
	LWLockRelease(ring->lock);
	if (!due)
		return;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	while (ring_rate_heap->n > 0 && ring_rate_heap->w[0].at <= now)
	{
		RingHoldKey k = ring_rate_heap->w[0].key;
		TimestampTz at = ring_rate_heap->w[0].at;
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
	if (ring_rate_heap == NULL || ring_rate_heap->n == 0)
		return DT_NOEND;
	return ring_rate_heap->w[0].at;
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
