/*-------------------------------------------------------------------------
 *
 * limits_claim.c
 *	  What a claim may take under its queue's limits: the queue's
 *	  concurrency limit and rate (a token bucket), the per-key quota of a
 *	  key-limited queue for pgjq.job's claims and the ring's, and the
 *	  readings await() takes of them.  The counters themselves, and how
 *	  they stay exact across transactions, are limits.c's.
 *
 * Order of operations of a claim (api/claim.c): pgjq_limits_reserve_queue
 * reserves up to `want` jobs against the queue's concurrency limit and takes
 * their tokens from its rate bucket; the store then takes jobs through the
 * quota (pgjq_limits_init_quota): for pgjq.job, key by key (quota_reserve
 * before a key's round, quota_release for part of it given back,
 * quota_settle after); for the ring, job by job under the ring's lock
 * (pgjq_limits_ring_key_take, with room made by pgjq_limits_reserve_room
 * before that lock), then pgjq_limits_ring_settle.  Last,
 * pgjq_limits_settle_queue gives back what was reserved and not taken, and
 * the caller notes a claim the limits cut short
 * (pgjq_limits_note_held_back).  Every reservation is a pending change of
 * the transaction (limits.c): it counts at once and is undone if the
 * (sub)transaction aborts.
 *
 * The rate bucket of a queue lives in its counter entry: refilled to now at
 * each reservation (rate tokens a second, up to burst, or ceil(rate)), it
 * gives whole tokens only.  The tokens of jobs reserved but not taken go
 * back at settle; those of a claim that rolls back do not (the rate limits
 * how many claims start).  It is in shared memory only: after a restart it
 * starts full.
 *
 * A key-limited queue whose keys are not counted yet (a new key limit) has
 * them counted by its first claim (queue_keys_ready; limits.c's header says
 * when that is exact); until then the claim takes nothing from the queue.
 *
 * Locking: limits_shared->lock, exclusive for changes and shared for
 * await()'s readings, held only around a few hash operations.  Room for the
 * pending ops is made before it is taken; an error is raised only after it
 * is released (limits_counter_or_error releases it itself).  Under the
 * ring's lock the order is ring lock, then this one, and nothing raises
 * (pgjq_limits_ring_key_take returns a code instead).  The ring's lanes of
 * a key whose count went down are brought back after the lock is released.
 *
 *-------------------------------------------------------------------------
 */
#include "state/limits_claim.h"
#include "state/limits_internal.h"

#include <math.h>

#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

bool
pgjq_queue_has_limits(const PgjqQueue *queue)
{
	return queue->concurrency > 0 || queue->key_concurrency > 0 || queue->rate > 0;
}

/* Refill the queue's token bucket to now; caller holds the lock. */
static void
refill(Counter *q, const PgjqQueue *queue, TimestampTz now)
{
	double		burst = queue->burst > 0 ? queue->burst : Max(1.0, ceil(queue->rate));

	if (q->tokens < 0 || q->refilled == 0)
		q->tokens = burst;
	else if (now > q->refilled)
		q->tokens = Min(burst, q->tokens + queue->rate * (double) (now - q->refilled) / USECS_PER_SEC);
	q->refilled = now;
}

/*
 * How many of `want` jobs a claim may take from the queue now, reserving
 * them against its concurrency limit and rate.  When the rate bucket gave
 * fewer than `want`, *token_in_us says when the next token is due.  Caller
 * settles with pgjq_limits_settle_queue().
 */
int
pgjq_limits_reserve_queue(const PgjqQueue *queue, int want, int64 *token_in_us)
{
	Counter    *q;
	int			granted = want;

	*token_in_us = 0;
	if (!pgjq_queue_has_limits(queue))
		return want;
	pgjq_limits_require_shmem("a queue with limits");
	if (!limits_tracking() && !limits_ensure_counted())
	{
		/* a standby cannot claim anyway: let the claim fail read-only */
		if (limits_untracked_why == UNTRACKED_RECOVERY)
			return want;
		limits_untracked_error();
	}
	limits_pending_room(1);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter_or_error(queue->queue_id, 0, true);
	q->limited = queue->concurrency > 0 || queue->key_concurrency > 0;
	if (queue->concurrency > 0)
		granted = Min(granted, Max(0, queue->concurrency -
								   (q->running - limits_own_ends(queue->queue_id, 0))));
	if (queue->rate > 0)
	{
		refill(q, queue, GetCurrentTimestamp());
		if (q->tokens < granted)
		{
			granted = Max(0, (int) floor(q->tokens));
			/* when the next token is due: a waiting claim sleeps no longer */
			*token_in_us = (int64) ceil((granted + 1 - q->tokens) / queue->rate * USECS_PER_SEC);
		}
		q->tokens -= granted;
	}
	if (queue->concurrency > 0)
	{
		q->running += granted;
		limits_add_pending(queue->queue_id, 0, granted, OP_COUNT);
	}
	LWLockRelease(limits_shared->lock);
	return granted;
}

/*
 * After the claim: `used` of the `reserved` jobs were taken (from pgjq.job
 * or the ring: both count).  Gives back the rest, counts the queue's running
 * jobs when it has no concurrency limit, and records a claim cut short.
 */
void
pgjq_limits_settle_queue(const PgjqQueue *queue, int reserved, int used)
{
	Counter    *q;

	if (limits_shared == NULL || !limits_tracking())
		return;
	if (!pgjq_queue_has_limits(queue) && used == 0)
		return;
	limits_pending_room(1);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter_or_error(queue->queue_id, 0, true);
	if (queue->concurrency > 0)
	{
		q->running -= reserved - used;
		limits_shrink_reservation(queue->queue_id, 0, reserved - used);
	}
	else if (used > 0)
	{
		q->running += used;
		limits_add_pending(queue->queue_id, 0, used, OP_COUNT);
	}
	if (queue->rate > 0)
		q->tokens += reserved - used;	/* the rate limits starts only */
	LWLockRelease(limits_shared->lock);
}

typedef struct QuotaState
{
	bool		key_limited;	/* reserve per key (keys of the queue tracked) */
	bool		blocked;		/* key-limited, but its keys cannot be counted
								 * now: grant nothing */
	bool		cut_short;
} QuotaState;

static int
quota_reserve(PgjqClaimQuota *quota, const char *fair_key, int want)
{
	QuotaState *st = quota->state;
	Counter    *c;
	int			granted;

	if (!st->key_limited)
		return want;
	if (st->blocked)
	{
		st->cut_short = true;
		return 0;
	}
	limits_pending_room(1);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	c = limits_counter_or_error(quota->queue->queue_id, limits_fair_key_hash(fair_key), true);
	granted = Min(want, Max(0, quota->queue->key_concurrency -
							(c->running - limits_own_ends(quota->queue->queue_id, limits_fair_key_hash(fair_key)))));
	if (granted == 0)
		st->cut_short = true;	/* a key with ready jobs skipped */
	c->running += granted;
	limits_drop_if_idle(c);
	if (granted > 0)
		limits_add_pending(quota->queue->queue_id, limits_fair_key_hash(fair_key), granted, OP_COUNT);
	LWLockRelease(limits_shared->lock);
	return granted;
}

/* Give back n reserved jobs of the key (a key-limited queue only). */
static void
quota_release(PgjqClaimQuota *quota, const char *fair_key, int n)
{
	QuotaState *st = quota->state;
	Counter    *c;
	uint64		h;

	if (limits_shared == NULL || !st->key_limited || st->blocked || n <= 0)
		return;
	h = limits_fair_key_hash(fair_key);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	c = limits_counter(quota->queue->queue_id, h, false);
	if (c)
	{
		c->running -= n;
		limits_shrink_reservation(quota->queue->queue_id, h, n);
		limits_drop_if_idle(c);
	}
	LWLockRelease(limits_shared->lock);
	pgjq_limits_keys_freed_hook(1, &quota->queue->queue_id, &h);
}

static void
quota_settle(PgjqClaimQuota *quota, const char *fair_key, int reserved, int picked)
{
	QuotaState *st = quota->state;
	Counter    *c;
	uint64		h;
	int32		queue_id = quota->queue->queue_id;

	if (limits_shared == NULL || !limits_tracking() || st->blocked)
		return;
	if (st->key_limited ? reserved == picked : picked == 0)
		return;
	h = limits_fair_key_hash(fair_key);
	limits_pending_room(1);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	if (st->key_limited)
	{
		c = limits_counter(queue_id, h, false);
		if (c)
		{
			c->running -= reserved - picked;
			limits_shrink_reservation(queue_id, h, reserved - picked);

			/*
			 * The limit bound this key: it took all it was allowed and is
			 * full (counted even when the key had no more ready jobs than
			 * that).
			 */
			if (picked > 0 && picked == reserved &&
				c->running >= quota->queue->key_concurrency)
				st->cut_short = true;
			limits_drop_if_idle(c);
		}
		LWLockRelease(limits_shared->lock);
		if (reserved > picked)
			pgjq_limits_keys_freed_hook(1, &queue_id, &h);
		return;
	}
	else
	{
		/*
		 * A queue without a key limit: its keys are counted only if they are
		 * tracked (the queue had a key limit); otherwise the jobs count as
		 * untracked until this transaction ends (see the file header).
		 */
		Counter    *q = limits_counter_or_error(queue_id, 0, true);

		if (q->keys_valid)
		{
			c = limits_counter_or_error(queue_id, h, false);
			c->running += picked;
			limits_add_pending(queue_id, h, picked, OP_COUNT);
		}
		else
		{
			q->untracked += picked;
			limits_add_pending(queue_id, 0, picked, OP_UNTRACKED);
		}
	}
	LWLockRelease(limits_shared->lock);
}

/*
 * A key count found the table full: leave no partial count of the queue's
 * keys behind, release the lock (held) and raise.
 */
static void
keys_count_full(int32 queue_id)
{
	HASH_SEQ_STATUS scan;
	Counter    *c;

	hash_seq_init(&scan, limits_counters);
	while ((c = hash_seq_search(&scan)) != NULL)
		if (c->key.dboid == MyDatabaseId && c->key.queue_id == queue_id && c->key.keyhash != 0)
			hash_search(limits_counters, &c->key, HASH_REMOVE, NULL);
	LWLockRelease(limits_shared->lock);
	limits_counters_full_error();
}

/*
 * Count the running jobs of each key of a key-limited queue whose keys are
 * not tracked yet (its key limit is new).  False if that cannot be exact now
 * (untracked changes are open or ended meanwhile; see the file header) or
 * the queue is gone.  Caller is inside the call's SPI connection.
 */
static bool
queue_keys_ready(int32 queue_id)
{
	Counter    *q;
	uint64		ends;
	bool		ready = false;
	int			nrk;
	int32	   *rk_qids;
	uint64	   *rk_hashes;
	int64	   *rk_counts;

	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter_or_error(queue_id, 0, true);
	if (q->keys_valid || q->untracked > 0)
	{
		ready = q->keys_valid;
		LWLockRelease(limits_shared->lock);
		return ready;
	}
	ends = q->untracked_ends;
	LWLockRelease(limits_shared->lock);

	/* the queue's running jobs (their claims count as untracked) */
	nrk = pgjq_limits_running_keys_hook(queue_id, &rk_qids, &rk_hashes, &rk_counts);

	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter(queue_id, 0, false);
	if (q && q->keys_valid)
		ready = true;
	else if (q && q->untracked == 0 && q->untracked_ends == ends)
	{
		for (int i = 0; i < nrk; i++)
		{
			Counter    *k = limits_counter(queue_id, rk_hashes[i], true);

			if (k == NULL)
				keys_count_full(queue_id);
			k->running += rk_counts[i];
		}
		q->keys_valid = true;
		ready = true;
	}
	LWLockRelease(limits_shared->lock);
	return ready;
}

/*
 * Set up the per-key quota of a claim on `queue`.  Without shared memory the
 * quota is unlimited (and a key limit is an error).
 */
void
pgjq_limits_init_quota(PgjqClaimQuota *quota, const PgjqQueue *queue)
{
	QuotaState *st = palloc0(sizeof(QuotaState));

	quota->key_rate_cut = false;
	st->key_limited = queue->key_concurrency > 0;
	if (st->key_limited)
	{
		pgjq_limits_require_shmem("a queue with key_concurrency");
		if (!limits_tracking() && !limits_ensure_counted())
		{
			if (limits_untracked_why != UNTRACKED_RECOVERY)
				limits_untracked_error();
			st->key_limited = false;	/* a standby: the claim fails anyway */
		}
		else
			st->blocked = !queue_keys_ready(queue->queue_id);
	}
	quota->per_key_limit = st->key_limited;
	quota->reserve = quota_reserve;
	quota->settle = quota_settle;
	quota->release = quota_release;
	quota->queue = queue;
	quota->state = st;
}

/* Room for n more pending changes, before a caller takes a lock of its own. */
void
pgjq_limits_reserve_room(int n)
{
	if (limits_shared != NULL)
		limits_pending_room(n);
}

/*
 * One job of the key (its pgjq_limits_key_hash) for a ring claim of a
 * key-limited queue, counted as a reservation like quota_reserve's.  Called
 * under the ring's lock (the lock order is ring, then counters), so it never
 * raises: 1 taken, 0 the key is at its limit, -1 no counter entry is free
 * (the caller raises after releasing its lock), -2 the keys cannot be
 * counted now (take nothing).  pgjq_limits_reserve_room made room for the
 * pending change.
 */
int
pgjq_limits_ring_key_take(PgjqClaimQuota *quota, uint64 keyhash)
{
	QuotaState *st = quota->state;
	int32		queue_id = quota->queue->queue_id;
	Counter    *c;
	int			r = 1;

	if (!st->key_limited)
		return 1;
	if (st->blocked || limits_pending_full())
	{
		st->cut_short = true;
		return -2;
	}
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	c = limits_counter(queue_id, keyhash, true);
	if (c == NULL)
		r = -1;
	else if (c->running - limits_own_ends(queue_id, keyhash) >= quota->queue->key_concurrency)
	{
		st->cut_short = true;
		limits_drop_if_idle(c);
		r = 0;
	}
	else
	{
		c->running++;
		limits_add_pending(queue_id, keyhash, 1, OP_COUNT);
	}
	LWLockRelease(limits_shared->lock);
	return r;
}

/*
 * After a ring claim of a queue without a key limit: its n jobs (keys as
 * pgjq_limits_key_hash) count per key if the queue's keys are tracked, else
 * as untracked changes, as quota_settle does for pgjq.job's claims.
 */
void
pgjq_limits_ring_settle(const PgjqQueue *queue, int n, const uint64 *hashes)
{
	Counter    *q;

	if (limits_shared == NULL || !limits_tracking() || n <= 0 || queue->key_concurrency > 0)
		return;
	limits_pending_room(n + 1);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter(queue->queue_id, 0, false);
	if (q && q->keys_valid)
	{
		for (int i = 0; i < n; i++)
		{
			Counter    *c = limits_counter(queue->queue_id, hashes[i], true);

			if (c == NULL)
			{
				LWLockRelease(limits_shared->lock);
				limits_counters_full_error();
			}
			c->running++;
			limits_add_pending(queue->queue_id, hashes[i], 1, OP_COUNT);
		}
	}
	else if (q)
	{
		q->untracked += n;
		limits_add_pending(queue->queue_id, 0, n, OP_UNTRACKED);
	}
	LWLockRelease(limits_shared->lock);
}

/* The error for pgjq_limits_ring_key_take's -1. */
void
pgjq_limits_counters_full(void)
{
	limits_counters_full_error();
}

/* A ring claim found only lanes parked at their key's limit. */
void
pgjq_limits_quota_held(PgjqClaimQuota *quota)
{
	((QuotaState *) quota->state)->cut_short = true;
}

/* True when a key limit refused some of what the claim asked for. */
bool
pgjq_limits_quota_cut_short(PgjqClaimQuota *quota)
{
	return ((QuotaState *) quota->state)->cut_short;
}

/* Count a claim that a queue-level limit cut short. */
static void
note_held_back(int32 queue_id)
{
	Counter    *q;

	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	q = limits_counter(queue_id, 0, true);
	if (q)
		q->held_back++;
	LWLockRelease(limits_shared->lock);
}

/*
 * True when the queue's concurrency limit leaves no room (await() does not
 * end on such a queue: a completion there wakes waiters anyway).
 */
bool
pgjq_limits_queue_full(int32 queue_id, int32 concurrency)
{
	Counter    *q;
	bool		full = false;

	if (limits_shared == NULL || concurrency <= 0)
		return false;
	if (!limits_tracking() && !limits_ensure_counted())
		return false;
	LWLockAcquire(limits_shared->lock, LW_SHARED);
	q = limits_counter(queue_id, 0, false);
	if (q && q->running >= concurrency)
		full = true;
	LWLockRelease(limits_shared->lock);
	return full;
}

/* A claim of the queue was cut short by its queue-level limits. */
void
pgjq_limits_note_held_back(int32 queue_id)
{
	if (limits_shared && limits_tracking())
		note_held_back(queue_id);
}

/*
 * True when the fair key of the queue has key_concurrency running jobs
 * (await() passes over such keys: a completion there wakes waiters anyway).
 */
bool
pgjq_limits_key_full(int32 queue_id, const char *fair_key, int32 key_concurrency)
{
	Counter    *c;
	bool		full = false;

	if (limits_shared == NULL || key_concurrency <= 0)
		return false;
	pgjq_limits_rebuild_if_needed();
	LWLockAcquire(limits_shared->lock, LW_SHARED);
	c = limits_counter(queue_id, limits_fair_key_hash(fair_key), false);
	if (c && c->running >= key_concurrency)
		full = true;
	LWLockRelease(limits_shared->lock);
	return full;
}

/*
 * Microseconds until the queue's rate bucket holds a whole token; 0 when it
 * holds one now (or the queue has no rate).  Reads the bucket without
 * taking from it, for await().
 */
int64
pgjq_limits_next_token_us(const PgjqQueue *queue)
{
	Counter    *q;
	int64		wait_us = 0;

	if (limits_shared == NULL || queue->rate <= 0)
		return 0;
	LWLockAcquire(limits_shared->lock, LW_SHARED);
	q = limits_counter(queue->queue_id, 0, false);
	if (q && q->tokens >= 0 && q->refilled != 0)
	{
		/* as refill() does, without writing */
		double		burst = queue->burst > 0 ? queue->burst : Max(1.0, ceil(queue->rate));
		TimestampTz now = GetCurrentTimestamp();
		double		tokens = q->tokens;

		if (now > q->refilled)
			tokens = Min(burst, tokens + queue->rate * (double) (now - q->refilled) / USECS_PER_SEC);
		if (tokens < 1)
			wait_us = (int64) ceil((1 - tokens) / queue->rate * USECS_PER_SEC);
	}
	LWLockRelease(limits_shared->lock);
	return wait_us;
}
