/*-------------------------------------------------------------------------
 *
 * limits.c
 *	  Concurrency limits (per queue and per fair key) and rate limits (per
 *	  queue), exact across every backend, kept in shared memory.
 *
 * Counters: a shared hash maps (database, queue, key hash) to the number of
 * running jobs; key hash 0 is the queue's own entry, which also holds the
 * rate-limit bucket and how many claims the limits cut short.  Counters are
 * kept for every queue (not only limited ones) so that a limit set later by
 * alter_queue starts from the truth.
 *
 * Exactness with transactions: a claim reserves capacity at once (so other
 * claimers see it) and gives it back if its (sub)transaction aborts; a job
 * that stops running (complete, fail, snooze, rescue, cancel, drop) lowers
 * the counters only when its transaction commits.  So the counters never
 * undercount the running jobs, and a claim never exceeds a limit.
 *
 * Rebuild: shared memory starts empty, so the first backend in a database
 * that needs the counters counts the running jobs from pgjq.job, while every
 * other counter user of that database waits on a heavyweight lock; no
 * transaction can have moved a counter before that, so the count is exact.
 * The database's "incarnation" (the OID of pgjq.job) detects DROP/CREATE
 * EXTENSION, which starts over.  The background worker triggers the rebuild
 * when it starts (startup, crash restart, promotion).
 *
 * Locking: counter_lock (one LWLock) guards the hash and the database table;
 * it is held only for a few hash operations, never across SQL.
 *
 *-------------------------------------------------------------------------
 */
#include "limits.h"
#include "spi_plans.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define PGJQ_MAX_DBS 64
#define PGJQ_LOCKTAG_REBUILD 0x706B

typedef struct CounterKey
{
	Oid			dboid;
	int32		queue_id;
	uint64		keyhash;		/* 0: the queue itself */
} CounterKey;

typedef struct Counter
{
	CounterKey	key;
	int32		running;
	int64		held_back;		/* queue entry: claims cut short by a limit */
	double		tokens;			/* queue entry: rate bucket */
	TimestampTz refilled;
	bool		limited;		/* queue entry: has a concurrency limit */
} Counter;

typedef struct DbState
{
	Oid			dboid;
	Oid			incarnation;	/* OID of pgjq.job when counted */
} DbState;

typedef struct LimitsShared
{
	LWLock	   *lock;
	DbState		dbs[PGJQ_MAX_DBS];
} LimitsShared;

static LimitsShared *shared = NULL;
static HTAB *counters = NULL;

/* Pending changes of this backend's open transaction. */
typedef struct PendingOp
{
	int32		queue_id;
	uint64		keyhash;
	int32		delta;			/* >0: applied reservation; <0: at commit */
	int			level;			/* subtransaction nesting level */
} PendingOp;

static PendingOp *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static Oid	pending_incarnation = InvalidOid;
static bool callbacks_registered = false;

static PgjqLeftRunningHook prev_left_running_hook = NULL;

static void left_running(int32 queue_id, const char *fair_key, int n);
static void xact_callback(XactEvent event, void *arg);
static void subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg);

Size
pgjq_limits_shmem_size(void)
{
	return add_size(MAXALIGN(sizeof(LimitsShared)),
					hash_estimate_size(pgjq_max_tracked_keys, sizeof(Counter)));
}

void
pgjq_limits_shmem_init(bool found)
{
	HASHCTL		info;
	bool		sfound;

	shared = ShmemInitStruct("pgjq limits", sizeof(LimitsShared), &sfound);
	if (!sfound)
	{
		memset(shared, 0, sizeof(LimitsShared));
		shared->lock = &(GetNamedLWLockTranche("pgjq"))[1].lock;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(CounterKey);
	info.entrysize = sizeof(Counter);
	counters = ShmemInitHash("pgjq counters", pgjq_max_tracked_keys, pgjq_max_tracked_keys,
							 &info, HASH_ELEM | HASH_BLOBS);
}

/* Per-backend setup, once shared memory exists (from _PG_init via shmem.c). */
void
pgjq_limits_startup(void)
{
	prev_left_running_hook = pgjq_left_running_hook;
	pgjq_left_running_hook = left_running;
}

static uint64
key_hash(const char *fair_key)
{
	uint64		h = hash_bytes_extended((const unsigned char *) fair_key, strlen(fair_key), 0x706a71);

	return h == 0 ? 1 : h;
}

bool
pgjq_queue_has_limits(const PgjqQueue *queue)
{
	return queue->concurrency > 0 || queue->key_concurrency > 0 || queue->rate > 0;
}

/* Raise object_not_in_prerequisite_state when pgjq was not preloaded. */
void
pgjq_limits_require_shmem(const char *what)
{
	if (shared == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs pgjq in shared_preload_libraries", what),
				 errhint("Add pgjq to shared_preload_libraries in postgresql.conf and restart the server.")));
}

static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	RegisterXactCallback(xact_callback, NULL);
	RegisterSubXactCallback(subxact_callback, NULL);
	callbacks_registered = true;
}

static DbState *
db_state(Oid dboid, bool create)
{
	DbState    *free_slot = NULL;

	for (int i = 0; i < PGJQ_MAX_DBS; i++)
	{
		if (shared->dbs[i].dboid == dboid)
			return &shared->dbs[i];
		if (shared->dbs[i].dboid == InvalidOid && free_slot == NULL)
			free_slot = &shared->dbs[i];
	}
	if (create && free_slot)
	{
		free_slot->dboid = dboid;
		free_slot->incarnation = InvalidOid;
	}
	return create ? free_slot : NULL;
}

/* The counter entry; caller holds the lock exclusively.  NULL if full. */
static Counter *
counter(int32 queue_id, uint64 keyhash, bool create)
{
	CounterKey	key = {MyDatabaseId, queue_id, keyhash};
	bool		found;
	Counter    *c;

	c = hash_search(counters, &key, create ? HASH_ENTER_NULL : HASH_FIND, &found);
	if (c && !found)
	{
		memset(((char *) c) + sizeof(CounterKey), 0, sizeof(Counter) - sizeof(CounterKey));
		c->tokens = -1;			/* bucket not filled yet */
	}
	return c;
}

static Counter *
counter_or_error(int32 queue_id, uint64 keyhash)
{
	Counter    *c = counter(queue_id, keyhash, true);

	if (c == NULL)
	{
		LWLockRelease(shared->lock);
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many running fair keys to track"),
				 errhint("Raise pgjq.max_tracked_keys.")));
	}
	return c;
}

static PgjqPlan plan_count_running = {
	"SELECT queue_id, fair_key, count(*)::int4 FROM pgjq.job WHERE state = 'a'"
	" GROUP BY queue_id, fair_key",
	0, {InvalidOid}
};

/*
 * Make sure this database's counters describe pgjq.job; count them if not.
 * Caller is in a transaction with the extension present.
 */
void
pgjq_limits_rebuild_if_needed(void)
{
	Oid			incarnation;
	DbState    *db;
	bool		valid;
	LOCKTAG		tag;

	if (shared == NULL)
		return;
	register_callbacks();
	incarnation = get_relname_relid("job", get_namespace_oid("pgjq", false));

	LWLockAcquire(shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId, false);
	valid = db && db->incarnation == incarnation;
	LWLockRelease(shared->lock);
	if (valid)
	{
		pending_incarnation = incarnation;
		return;
	}

	/* serialize rebuilders of this database; others wait here */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, PGJQ_LOCKTAG_REBUILD);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	LWLockAcquire(shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId, false);
	valid = db && db->incarnation == incarnation;
	LWLockRelease(shared->lock);
	if (!valid)
	{
		HASH_SEQ_STATUS scan;
		Counter    *c;
		int			n;
		int32	   *qids;
		uint64	   *hashes;
		int32	   *counts;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "pgjq: SPI_connect failed");
		pgjq_spi_run(&plan_count_running, NULL, NULL, 0);
		n = (int) SPI_processed;
		qids = palloc(sizeof(int32) * Max(n, 1));
		hashes = palloc(sizeof(uint64) * Max(n, 1));
		counts = palloc(sizeof(int32) * Max(n, 1));
		for (int i = 0; i < n; i++)
		{
			bool		isnull;

			qids[i] = DatumGetInt32(pgjq_spi_get(i, 1, &isnull));
			hashes[i] = key_hash(TextDatumGetCString(pgjq_spi_get(i, 2, &isnull)));
			counts[i] = DatumGetInt32(pgjq_spi_get(i, 3, &isnull));
		}

		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		hash_seq_init(&scan, counters);
		while ((c = hash_seq_search(&scan)) != NULL)
			if (c->key.dboid == MyDatabaseId)
				hash_search(counters, &c->key, HASH_REMOVE, NULL);
		for (int i = 0; i < n; i++)
		{
			counter_or_error(qids[i], 0)->running += counts[i];
			counter_or_error(qids[i], hashes[i])->running += counts[i];
		}
		db = db_state(MyDatabaseId, true);
		if (db == NULL)
		{
			LWLockRelease(shared->lock);
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("pgjq tracks limits in at most %d databases", PGJQ_MAX_DBS)));
		}
		db->incarnation = incarnation;
		LWLockRelease(shared->lock);
		SPI_finish();
	}
	LockRelease(&tag, ExclusiveLock, false);
	pending_incarnation = incarnation;
}

static void
drop_if_idle(Counter *c)
{
	if (c->key.keyhash != 0 && c->running <= 0)
		hash_search(counters, &c->key, HASH_REMOVE, NULL);
}

static void
add_pending(int32 queue_id, uint64 keyhash, int32 delta)
{
	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, sizeof(PendingOp) * newmax);
		else
			pending = repalloc(pending, sizeof(PendingOp) * newmax);
		maxpending = newmax;
	}
	pending[npending].queue_id = queue_id;
	pending[npending].keyhash = keyhash;
	pending[npending].delta = delta;
	pending[npending].level = GetCurrentTransactionNestLevel();
	npending++;
}

/*
 * Lower this transaction's pending reservation of (queue, key) by n, when
 * part of it is given back before commit.  Caller holds the lock.
 */
static void
shrink_reservation(int32 queue_id, uint64 keyhash, int32 n)
{
	for (int i = npending - 1; i >= 0; i--)
		if (pending[i].queue_id == queue_id && pending[i].keyhash == keyhash &&
			pending[i].delta > 0)
		{
			pending[i].delta -= n;
			return;
		}
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
	pgjq_limits_rebuild_if_needed();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter_or_error(queue->queue_id, 0);
	q->limited = queue->concurrency > 0 || queue->key_concurrency > 0;
	if (queue->concurrency > 0)
		granted = Min(granted, Max(0, queue->concurrency - q->running));
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
		add_pending(queue->queue_id, 0, granted);
	}
	LWLockRelease(shared->lock);
	return granted;
}

/*
 * After the claim: `used` of the `reserved` jobs were taken.  Gives back the
 * rest, counts the queue's running jobs when it has no concurrency limit,
 * and records a claim cut short.
 */
void
pgjq_limits_settle_queue(const PgjqQueue *queue, int reserved, int used)
{
	Counter    *q;

	if (shared == NULL)
		return;
	if (!pgjq_queue_has_limits(queue) && used == 0)
		return;
	pgjq_limits_rebuild_if_needed();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter_or_error(queue->queue_id, 0);
	if (queue->concurrency > 0)
	{
		q->running -= reserved - used;
		shrink_reservation(queue->queue_id, 0, reserved - used);
	}
	else if (used > 0)
	{
		q->running += used;
		add_pending(queue->queue_id, 0, used);
	}
	if (queue->rate > 0)
		q->tokens += reserved - used;	/* the rate limits starts only */
	LWLockRelease(shared->lock);
}

typedef struct QuotaState
{
	bool		key_limited;
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
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter_or_error(quota->queue->queue_id, key_hash(fair_key));
	granted = Min(want, Max(0, quota->queue->key_concurrency - c->running));
	if (granted == 0)
		st->cut_short = true;	/* a key with ready jobs skipped */
	c->running += granted;
	drop_if_idle(c);
	if (granted > 0)
		add_pending(quota->queue->queue_id, key_hash(fair_key), granted);
	LWLockRelease(shared->lock);
	return granted;
}

/* Give back n reserved jobs of the key (a key-limited queue only). */
static void
quota_release(PgjqClaimQuota *quota, const char *fair_key, int n)
{
	QuotaState *st = quota->state;
	Counter    *c;
	uint64		h;

	if (shared == NULL || !st->key_limited || n <= 0)
		return;
	h = key_hash(fair_key);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter_or_error(quota->queue->queue_id, h);
	c->running -= n;
	shrink_reservation(quota->queue->queue_id, h, n);
	drop_if_idle(c);
	LWLockRelease(shared->lock);
}

static void
quota_settle(PgjqClaimQuota *quota, const char *fair_key, int reserved, int picked)
{
	QuotaState *st = quota->state;
	Counter    *c;
	uint64		h;

	if (shared == NULL || (reserved == picked && st->key_limited) || (!st->key_limited && picked == 0))
		return;
	h = key_hash(fair_key);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter_or_error(quota->queue->queue_id, h);
	if (st->key_limited)
	{
		c->running -= reserved - picked;
		shrink_reservation(quota->queue->queue_id, h, reserved - picked);

		/*
		 * The limit bound this key: it took all it was allowed and is full
		 * (counted even when the key had no more ready jobs than that).
		 */
		if (picked > 0 && picked == reserved &&
			c->running >= quota->queue->key_concurrency)
			st->cut_short = true;
	}
	else
	{
		c->running += picked;
		add_pending(quota->queue->queue_id, h, picked);
	}
	drop_if_idle(c);
	LWLockRelease(shared->lock);
}

/*
 * Set up the per-key quota of a claim on `queue`.  Without shared memory the
 * quota is unlimited (and a key limit is an error).
 */
void
pgjq_limits_init_quota(PgjqClaimQuota *quota, const PgjqQueue *queue)
{
	QuotaState *st = palloc0(sizeof(QuotaState));

	st->key_limited = queue->key_concurrency > 0;
	if (st->key_limited)
		pgjq_limits_require_shmem("a queue with key_concurrency");
	if (shared)
		pgjq_limits_rebuild_if_needed();
	quota->per_key_limit = st->key_limited;
	quota->reserve = quota_reserve;
	quota->settle = quota_settle;
	quota->release = quota_release;
	quota->queue = queue;
	quota->state = st;
}

/* True when a key limit refused some of what the claim asked for. */
bool
pgjq_limits_quota_cut_short(PgjqClaimQuota *quota)
{
	return ((QuotaState *) quota->state)->cut_short;
}

/* Storage hook: n jobs of (queue, key) stop running at commit. */
static void
left_running(int32 queue_id, const char *fair_key, int n)
{
	if (prev_left_running_hook)
		prev_left_running_hook(queue_id, fair_key, n);
	if (n <= 0)
		return;
	pgjq_limits_rebuild_if_needed();
	add_pending(queue_id, 0, -n);
	add_pending(queue_id, key_hash(fair_key), -n);
}

/* Count a claim that a queue-level limit cut short. */
static void
note_held_back(int32 queue_id)
{
	Counter    *q;

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter(queue_id, 0, true);
	if (q)
		q->held_back++;
	LWLockRelease(shared->lock);
}

/*
 * Apply (commit) or undo (abort) this transaction's pending changes at or
 * below subtransaction level `level`.
 */
static void
resolve(bool commit, int level)
{
	int			kept = 0;
	bool		same_db;

	if (npending == 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	{
		DbState    *db = db_state(MyDatabaseId, false);

		same_db = db && db->incarnation == pending_incarnation;
	}
	for (int i = 0; i < npending; i++)
	{
		PendingOp  *op = &pending[i];
		int32		change = 0;

		if (op->level < level)
		{
			pending[kept++] = *op;
			continue;
		}
		if (commit && op->delta < 0)
			change = op->delta;
		else if (!commit && op->delta > 0)
			change = -op->delta;
		if (change != 0 && same_db)
		{
			Counter    *c = counter(op->queue_id, op->keyhash, false);

			if (c)
			{
				c->running = Max(0, c->running + change);
				if (commit && op->keyhash == 0 && c->limited)
					pgjq_wait_wake(MyDatabaseId, op->queue_id, -change);
				drop_if_idle(c);
			}
		}
	}
	npending = kept;
	LWLockRelease(shared->lock);
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			resolve(true, 0);
			npending = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			resolve(false, 0);
			npending = 0;
			break;
		default:
			break;
	}
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			resolve(false, level);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (int i = 0; i < npending; i++)
				if (pending[i].level >= level)
					pending[i].level = level - 1;
			break;
		default:
			break;
	}
}

PG_FUNCTION_INFO_V1(pgjq_limits);
PG_FUNCTION_INFO_V1(pgjq_preloaded);

/* pgjq._preloaded(): whether the shared-memory features are available. */
Datum
pgjq_preloaded(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(shared != NULL);
}

/* pgjq._limits(): this database's queue counters, for queue_stats. */
Datum
pgjq_limits(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	Counter    *c;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext old;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgjq: _limits() must return a record");
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTupleDescCopy(tupdesc);
	store = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(old);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;
	if (shared == NULL)
		return (Datum) 0;

	LWLockAcquire(shared->lock, LW_SHARED);
	hash_seq_init(&scan, counters);
	while ((c = hash_seq_search(&scan)) != NULL)
	{
		Datum		values[3];
		bool		nulls[3] = {0};

		if (c->key.dboid != MyDatabaseId || c->key.keyhash != 0)
			continue;
		values[0] = Int32GetDatum(c->key.queue_id);
		values[1] = Int32GetDatum(c->running);
		values[2] = Int64GetDatum(c->held_back);
		tuplestore_putvalues(store, tupdesc, values, nulls);
	}
	LWLockRelease(shared->lock);
	return (Datum) 0;
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

	if (shared == NULL || concurrency <= 0)
		return false;
	pgjq_limits_rebuild_if_needed();
	LWLockAcquire(shared->lock, LW_SHARED);
	q = counter(queue_id, 0, false);
	if (q && q->running >= concurrency)
		full = true;
	LWLockRelease(shared->lock);
	return full;
}

/* A claim of the queue was cut short by its queue-level limits. */
void
pgjq_limits_note_held_back(int32 queue_id)
{
	if (shared)
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

	if (shared == NULL || key_concurrency <= 0)
		return false;
	pgjq_limits_rebuild_if_needed();
	LWLockAcquire(shared->lock, LW_SHARED);
	c = counter(queue_id, key_hash(fair_key), false);
	if (c && c->running >= key_concurrency)
		full = true;
	LWLockRelease(shared->lock);
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

	if (shared == NULL || queue->rate <= 0)
		return 0;
	LWLockAcquire(shared->lock, LW_SHARED);
	q = counter(queue->queue_id, 0, false);
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
	LWLockRelease(shared->lock);
	return wait_us;
}
