/*-------------------------------------------------------------------------
 *
 * limits.c
 *	  Concurrency limits (per queue and per fair key) and rate limits (per
 *	  queue), exact across every backend, kept in shared memory.
 *
 * Counters: a fixed-size shared hash (pgjq.max_tracked_keys entries) maps
 * (database, queue, key hash) to the number of running jobs; key hash 0 is
 * the queue's own entry, which also holds the rate-limit bucket and how many
 * claims the limits cut short.  Queue entries are kept for every queue with
 * running jobs (not only limited ones) so that a concurrency limit set later
 * by alter_queue starts from the truth; they go when drop_queue commits.
 * Key entries exist only for running keys of queues whose keys are tracked
 * ("keys_valid"), which is set for key-limited queues only.  When the table
 * is full, only the claim that needs a new entry fails (54000).
 *
 * Exactness with transactions: a claim reserves capacity at once (so other
 * claimers see it) and gives it back if its (sub)transaction aborts; a job
 * that stops running (complete, fail, snooze, rescue, cancel, drop) lowers
 * the counters only when its transaction commits.  So the counters never
 * undercount the running jobs, and a claim never exceeds a limit.  A claim
 * may use the room of jobs its own transaction has ended (own_ends()): both
 * commit or abort together, which is what a worker's fused cycle
 * (complete_and_claim) needs at a concurrency limit.
 *
 * Rebuild: shared memory starts empty, so the first pgjq call in a database
 * counts the running jobs from the ring (rebuilt first if it
 * is not yet, ring.h), before any statement of its own
 * (pgjq_storage_begin calls the begin hook), while every other pgjq call of
 * that database waits on a heavyweight lock; no transaction can have moved a
 * counter before that, so the count is exact.  The database's "incarnation"
 * (the OID of pgjq.job) detects DROP/CREATE EXTENSION, which starts over.
 * Nothing is counted while recovery is in progress: a hot standby's count
 * would be stale after promotion, and a standby cannot change jobs anyway.
 *
 * Keys of a queue that gets a key limit later (alter_queue) are counted by
 * the first key-limited claim.  Until then, claims and finished jobs of the
 * queue are "untracked": the queue entry counts those of open transactions
 * (untracked) and how many such transactions ended (untracked_ends).  The
 * key count is taken only when no untracked change is open and none ended
 * while counting, so it is exact; otherwise that claim gets nothing from the
 * queue this time (held back), which is safe.
 *
 * Databases: pgjq.max_databases slots.  Slots (and counter entries) of
 * databases that no longer exist are freed when a database is counted or the
 * table is full (pg_database is a shared catalog).  A database without a
 * slot runs its queues without limits normally and refuses limited queues
 * (53000).
 *
 * Two-phase commit: PREPARE TRANSACTION is refused (0A000) when the
 * transaction changed the counters; a prepared transaction's outcome is not
 * known to the counters.
 *
 * Ring queues (ring.h) count the same way: their jobs by key hash
 * (pgjq_limits_key_hash, which the ring's lanes use too).  A ring claim of a
 * key-limited queue reserves job by job while it holds the ring's lock
 * (pgjq_limits_ring_key_take; the order is always ring lock, then this
 * one), and parks a lane whose key is full; every decrement of a key count
 * calls pgjq_ring_keys_freed after this lock is released, so the lane comes
 * back.
 *
 * Locking: counter_lock (one LWLock) guards the hash and the database table;
 * it is held only for a few hash operations, never across SQL or catalog
 * access.  Waiters are woken after it is released.
 *
 *-------------------------------------------------------------------------
 */
#include "state/limits.h"
#include "common/guc.h"
#include "state/wait.h"
#include "common/spi_plans.h"

#include <math.h>

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "common/crash_points.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

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
	int32		untracked;		/* queue entry: open changes of untracked keys */
	uint64		untracked_ends; /* queue entry: transactions with such changes
								 * that ended */
	int64		held_back;		/* queue entry: claims cut short by a limit */
	double		tokens;			/* queue entry: rate bucket */
	TimestampTz refilled;
	bool		limited;		/* queue entry: has a concurrency limit */
	bool		keys_valid;		/* queue entry: its key entries are exact */
} Counter;

typedef struct DbState
{
	Oid			dboid;			/* InvalidOid: free slot */
	Oid			incarnation;	/* OID of pgjq.job when counted; InvalidOid
								 * while (re)counting */
} DbState;

typedef struct LimitsShared
{
	LWLock	   *lock;
	int			ndbs;
	DbState		dbs[FLEXIBLE_ARRAY_MEMBER];
} LimitsShared;

static LimitsShared *shared = NULL;
static HTAB *counters = NULL;

/* Pending changes of this backend's open transaction. */
typedef enum PendingKind
{
	OP_COUNT,					/* delta >0: applied reservation; <0: at
								 * commit */
	OP_UNTRACKED,				/* delta: the queue's untracked, until the end */
	OP_DROP_QUEUE				/* at commit: forget the queue's entries */
} PendingKind;

typedef struct PendingOp
{
	int32		queue_id;
	uint64		keyhash;
	int32		delta;
	PendingKind kind;
	int			level;			/* subtransaction nesting level */
} PendingOp;

typedef struct WakeUp
{
	int32		queue_id;
	int			n;
} WakeUp;

static PendingOp *pending = NULL;
static WakeUp *wakeups = NULL;	/* resolve's scratch, as large as pending */
static int32 *freed_qids = NULL;	/* keys whose count went down: ring.h */
static uint64 *freed_hashes = NULL; /* (resolve's scratch too) */
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks_registered = false;

/*
 * The incarnation this backend's counter changes belong to: set by
 * ensure_counted() at the start of every pgjq call, InvalidOid when the
 * database is not tracked (then untracked_why says why).
 */
static Oid	pending_incarnation = InvalidOid;

typedef enum UntrackedWhy
{
	UNTRACKED_RECOVERY,
	UNTRACKED_NO_SLOT,
	UNTRACKED_FULL
} UntrackedWhy;

static UntrackedWhy untracked_why = UNTRACKED_RECOVERY;
static Oid	known_valid = InvalidOid;	/* incarnation seen valid here */
static TimestampTz retry_count_at = 0;

/* set by _PG_init (limits.h) */
PgjqLimitsRunningKeysHook pgjq_limits_running_keys_hook = NULL;
PgjqLimitsKeysFreedHook pgjq_limits_keys_freed_hook = NULL;

static void xact_callback(XactEvent event, void *arg);
static void subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg);

static Size
shared_size(void)
{
	return add_size(offsetof(LimitsShared, dbs),
					mul_size(pgjq_max_databases, sizeof(DbState)));
}

Size
pgjq_limits_shmem_size(void)
{
	return add_size(MAXALIGN(shared_size()),
					hash_estimate_size(pgjq_max_tracked_keys, sizeof(Counter)));
}

void
pgjq_limits_shmem_init(bool found)
{
	HASHCTL		info;
	bool		sfound;

	shared = ShmemInitStruct("pgjq limits", shared_size(), &sfound);
	if (!sfound)
	{
		memset(shared, 0, shared_size());
		shared->lock = &(GetNamedLWLockTranche("pgjq"))[1].lock;
		shared->ndbs = pgjq_max_databases;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(CounterKey);
	info.entrysize = sizeof(Counter);

	/*
	 * HASH_FIXED_SIZE: never take more from the shared reserve, which the
	 * lock manager needs; a full table fails the claim that needs an entry.
	 */
	counters = ShmemInitHash("pgjq counters", pgjq_max_tracked_keys, pgjq_max_tracked_keys,
							 &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/* A fair key's counter hash; never 0 (that is the queue's own entry). */
uint64
pgjq_limits_key_hash(const char *fair_key, int len)
{
	uint64		h = hash_bytes_extended((const unsigned char *) fair_key, len, 0x706a71);

	return h == 0 ? 1 : h;
}

static uint64
key_hash(const char *fair_key)
{
	return pgjq_limits_key_hash(fair_key, strlen(fair_key));
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

/* True when this call's counter changes count (see ensure_counted). */
static inline bool
tracking(void)
{
	return OidIsValid(pending_incarnation);
}

/* The database's slot, or NULL; caller holds the lock. */
static DbState *
db_state(Oid dboid)
{
	for (int i = 0; i < shared->ndbs; i++)
		if (shared->dbs[i].dboid == dboid)
			return &shared->dbs[i];
	return NULL;
}

/* The database's slot, taking a free one if needed; caller holds it exclusively. */
static DbState *
db_state_create(Oid dboid)
{
	DbState    *db = db_state(dboid);

	if (db == NULL && (db = db_state(InvalidOid)) != NULL)
	{
		db->dboid = dboid;
		db->incarnation = InvalidOid;
	}
	return db;
}

/* Remove every entry of the database (queue_id 0: of all its queues). */
static void
remove_entries(Oid dboid, int32 queue_id)
{
	HASH_SEQ_STATUS scan;
	Counter    *c;

	hash_seq_init(&scan, counters);
	while ((c = hash_seq_search(&scan)) != NULL)
		if (c->key.dboid == dboid && (queue_id == 0 || c->key.queue_id == queue_id))
			hash_search(counters, &c->key, HASH_REMOVE, NULL);
}

/*
 * Free the slots and counter entries of databases that were dropped.  Needs
 * a transaction (pg_database is read through the syscache); caller does not
 * hold the lock.  True if anything was freed.
 */
static bool
forget_gone_databases(void)
{
	Oid		   *dbs = palloc(sizeof(Oid) * shared->ndbs);
	int			n = 0;
	int			ngone = 0;

	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < shared->ndbs; i++)
		if (OidIsValid(shared->dbs[i].dboid) && shared->dbs[i].dboid != MyDatabaseId)
			dbs[n++] = shared->dbs[i].dboid;
	LWLockRelease(shared->lock);

	/*
	 * A database created after this backend's catalog snapshot may already
	 * have a slot: read pg_database afresh (its creation's invalidation was
	 * sent before anyone could connect to it and take the slot).
	 */
	AcceptInvalidationMessages();
	InvalidateCatalogSnapshot();
	for (int i = 0; i < n; i++)
		if (!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbs[i])))
			dbs[ngone++] = dbs[i];
	if (ngone == 0)
	{
		pfree(dbs);
		return false;
	}

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < ngone; i++)
	{
		DbState    *db = db_state(dbs[i]);

		if (db)
		{
			db->dboid = InvalidOid;
			db->incarnation = InvalidOid;
		}
		remove_entries(dbs[i], 0);
	}
	LWLockRelease(shared->lock);
	pfree(dbs);
	return true;
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

static void
counters_full_error(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("pgjq's limit counters are full"),
			 errdetail("All %d entries are taken by queues with running jobs and by running keys of key-limited queues.",
					   pgjq_max_tracked_keys),
			 errhint("Raise pgjq.max_tracked_keys, or run fewer distinct fair keys of key-limited queues at once.")));
}

/*
 * The counter entry, created if missing; caller holds the lock exclusively.
 * When the table is full: if may_gc (the caller holds no entry pointer), the
 * lock is released to free the entries of dropped databases and taken again;
 * if that does not help, the lock is released and an error raised.
 */
static Counter *
counter_or_error(int32 queue_id, uint64 keyhash, bool may_gc)
{
	Counter    *c = counter(queue_id, keyhash, true);

	if (c == NULL && may_gc)
	{
		bool		freed;

		LWLockRelease(shared->lock);
		freed = forget_gone_databases();
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		if (freed)
			c = counter(queue_id, keyhash, true);
	}
	if (c == NULL)
	{
		LWLockRelease(shared->lock);
		counters_full_error();
	}
	return c;
}

/* Error for a limited queue in a database whose counters are not kept. */
static void
untracked_error(void)
{
	if (untracked_why == UNTRACKED_NO_SLOT)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("pgjq tracks limits in at most %d databases", pgjq_max_databases),
				 errdetail("Queues with limits cannot be used in this database until a database that uses them is dropped."),
				 errhint("Raise pgjq.max_databases.")));
	counters_full_error();
}

static PgjqPlan plan_key_limited = {
	"SELECT queue_id FROM pgjq.queue WHERE key_concurrency > 0",
	0, {InvalidOid}
};


/*
 * Count this database's running jobs into its counters (its slot is
 * invalid).  Caller holds the rebuild lock of the database.  False when no
 * slot is free or the table is full (untracked_why says which).
 */
static bool
count_database(Oid incarnation)
{
	DbState    *db;
	bool		full = false;
	int			nkeyed,
				nrk;
	int32	   *keyed_qids;
	int32	   *rk_qids;
	uint64	   *rk_hashes;
	int64	   *rk_counts;

	(void) forget_gone_databases();
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	db = db_state_create(MyDatabaseId);
	if (db == NULL)
	{
		LWLockRelease(shared->lock);
		untracked_why = UNTRACKED_NO_SLOT;
		return false;
	}
	db->incarnation = InvalidOid;
	remove_entries(MyDatabaseId, 0);
	LWLockRelease(shared->lock);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	/* the key-limited queues, whose running jobs count per key too */
	pgjq_spi_run(&plan_key_limited, NULL, NULL, 0);
	nkeyed = (int) SPI_processed;
	keyed_qids = palloc(sizeof(int32) * Max(nkeyed, 1));
	for (int i = 0; i < nkeyed; i++)
	{
		bool		isnull;

		keyed_qids[i] = DatumGetInt32(pgjq_spi_get(i, 1, &isnull));
	}

	/*
	 * the ring's running jobs (ring.h), per (queue, key): the queue's are
	 * their sum
	 */
	nrk = pgjq_limits_running_keys_hook(0, &rk_qids, &rk_hashes, &rk_counts);

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	db = db_state(MyDatabaseId);
	for (int i = 0; db && i < nrk && !full; i++)
	{
		Counter    *q = counter(rk_qids[i], 0, true);

		if (q == NULL)
			full = true;
		else
			q->running += rk_counts[i];
	}
	for (int i = 0; db && i < nrk && !full; i++)
	{
		bool		keyed = false;
		Counter    *q;
		Counter    *k;

		for (int j = 0; j < nkeyed && !keyed; j++)
			keyed = keyed_qids[j] == rk_qids[i];
		if (!keyed)
			continue;
		q = counter(rk_qids[i], 0, true);
		k = q == NULL ? NULL : counter(rk_qids[i], rk_hashes[i], true);
		if (k == NULL)
			full = true;
		else
		{
			q->keys_valid = true;
			k->running += rk_counts[i];
		}
	}
	if (full)
		remove_entries(MyDatabaseId, 0);
	else if (db)
		db->incarnation = incarnation;
	LWLockRelease(shared->lock);
	SPI_finish();
	if (full)
		untracked_why = UNTRACKED_FULL;
	return db != NULL && !full;
}

/*
 * Make sure this database's counters describe pgjq.job, counting them if
 * not, and set pending_incarnation for this call.  Caller is in a
 * transaction with the extension present.  False when the database is not
 * tracked: in recovery (nothing can change jobs there, and a count taken
 * there would be stale after promotion), or when it has no slot or the table
 * is full (tried again after a second).
 */
static bool
ensure_counted(void)
{
	Oid			incarnation;
	DbState    *db;
	bool		valid;
	LOCKTAG		tag;

	if (shared == NULL)
		return false;
	register_callbacks();
	if (RecoveryInProgress())
	{
		untracked_why = UNTRACKED_RECOVERY;
		pending_incarnation = InvalidOid;
		return false;
	}
	incarnation = get_relname_relid("job", get_namespace_oid("pgjq", false));

	/*
	 * Once counted, a database stays valid until a new incarnation (seen
	 * here) or a restart (a new process): no need for the lock then.
	 */
	if (OidIsValid(incarnation) && incarnation == known_valid)
	{
		pending_incarnation = incarnation;
		return true;
	}
	LWLockAcquire(shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId);
	valid = db && OidIsValid(db->incarnation) && db->incarnation == incarnation;
	LWLockRelease(shared->lock);
	if (valid)
	{
		pending_incarnation = known_valid = incarnation;
		return true;
	}
	pending_incarnation = InvalidOid;
	if (retry_count_at != 0 && GetCurrentTimestamp() < retry_count_at)
		return false;

	/* serialize rebuilders of this database; others wait here */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, PGJQ_LOCKTAG_REBUILD);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	LWLockAcquire(shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId);
	valid = db && OidIsValid(db->incarnation) && db->incarnation == incarnation;
	LWLockRelease(shared->lock);
	if (!valid)
		valid = count_database(incarnation);
	LockRelease(&tag, ExclusiveLock, false);

	retry_count_at = valid ? 0 : GetCurrentTimestamp() + USECS_PER_SEC;
	if (valid)
		pending_incarnation = known_valid = incarnation;
	return valid;
}

/*
 * The begin hook of the storage engine (registered by _PG_init): before any
 * statement of a call.
 */
void
pgjq_limits_storage_begin(void)
{
	(void) ensure_counted();
}

/*
 * Make sure this database's counters describe pgjq.job, counting them if
 * not (the worker calls it when it starts).
 */
void
pgjq_limits_rebuild_if_needed(void)
{
	(void) ensure_counted();
}

static void
drop_if_idle(Counter *c)
{
	if (c->key.keyhash != 0 && c->running <= 0)
		hash_search(counters, &c->key, HASH_REMOVE, NULL);
}

/* Make room for n more pending ops (before taking the lock). */
static void
pending_room(int n)
{
	if (npending + n > maxpending)
	{
		int			newmax = Max(16, Max(maxpending * 2, npending + n));

		if (pending == NULL)
		{
			pending = MemoryContextAlloc(TopMemoryContext, sizeof(PendingOp) * newmax);
			wakeups = MemoryContextAlloc(TopMemoryContext, sizeof(WakeUp) * newmax);
			freed_qids = MemoryContextAlloc(TopMemoryContext, sizeof(int32) * newmax);
			freed_hashes = MemoryContextAlloc(TopMemoryContext, sizeof(uint64) * newmax);
		}
		else
		{
			pending = repalloc(pending, sizeof(PendingOp) * newmax);
			wakeups = repalloc(wakeups, sizeof(WakeUp) * newmax);
			freed_qids = repalloc(freed_qids, sizeof(int32) * newmax);
			freed_hashes = repalloc(freed_hashes, sizeof(uint64) * newmax);
		}
		maxpending = newmax;
	}
}

/* Record a pending op; room was made with pending_room() before the lock. */
static void
add_pending(int32 queue_id, uint64 keyhash, int32 delta, PendingKind kind)
{
	Assert(npending < maxpending);
	pending[npending].queue_id = queue_id;
	pending[npending].keyhash = keyhash;
	pending[npending].delta = delta;
	pending[npending].kind = kind;
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
		if (pending[i].kind == OP_COUNT && pending[i].queue_id == queue_id &&
			pending[i].keyhash == keyhash && pending[i].delta > 0)
		{
			pending[i].delta -= n;
			return;
		}
}

/*
 * How many running jobs of (queue, key) this transaction has already ended
 * (their counts drop at its commit).  A claim later in the same transaction
 * may use that room: its reservation and those ends commit or abort
 * together (a pending end sits at this subtransaction level or an outer
 * one, so it cannot be rolled back while the claim stays), and the room it
 * used is no longer pending room once the claim counts (running includes
 * the claim's own reservation), so nothing is used twice.  This is what
 * lets complete_and_claim (or complete then claim in one transaction) take
 * the next batch at a concurrency limit.  Caller holds the lock.
 */
static int32
own_ends(int32 queue_id, uint64 keyhash)
{
	int32		n = 0;

	for (int i = 0; i < npending; i++)
		if (pending[i].kind == OP_COUNT && pending[i].queue_id == queue_id &&
			pending[i].keyhash == keyhash && pending[i].delta < 0)
			n -= pending[i].delta;
	return n;
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
	if (!tracking() && !ensure_counted())
	{
		/* a standby cannot claim anyway: let the claim fail read-only */
		if (untracked_why == UNTRACKED_RECOVERY)
			return want;
		untracked_error();
	}
	pending_room(1);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter_or_error(queue->queue_id, 0, true);
	q->limited = queue->concurrency > 0 || queue->key_concurrency > 0;
	if (queue->concurrency > 0)
		granted = Min(granted, Max(0, queue->concurrency -
								   (q->running - own_ends(queue->queue_id, 0))));
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
		add_pending(queue->queue_id, 0, granted, OP_COUNT);
	}
	LWLockRelease(shared->lock);
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

	if (shared == NULL || !tracking())
		return;
	if (!pgjq_queue_has_limits(queue) && used == 0)
		return;
	pending_room(1);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter_or_error(queue->queue_id, 0, true);
	if (queue->concurrency > 0)
	{
		q->running -= reserved - used;
		shrink_reservation(queue->queue_id, 0, reserved - used);
	}
	else if (used > 0)
	{
		q->running += used;
		add_pending(queue->queue_id, 0, used, OP_COUNT);
	}
	if (queue->rate > 0)
		q->tokens += reserved - used;	/* the rate limits starts only */
	LWLockRelease(shared->lock);
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
	pending_room(1);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter_or_error(quota->queue->queue_id, key_hash(fair_key), true);
	granted = Min(want, Max(0, quota->queue->key_concurrency -
							(c->running - own_ends(quota->queue->queue_id, key_hash(fair_key)))));
	if (granted == 0)
		st->cut_short = true;	/* a key with ready jobs skipped */
	c->running += granted;
	drop_if_idle(c);
	if (granted > 0)
		add_pending(quota->queue->queue_id, key_hash(fair_key), granted, OP_COUNT);
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

	if (shared == NULL || !st->key_limited || st->blocked || n <= 0)
		return;
	h = key_hash(fair_key);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter(quota->queue->queue_id, h, false);
	if (c)
	{
		c->running -= n;
		shrink_reservation(quota->queue->queue_id, h, n);
		drop_if_idle(c);
	}
	LWLockRelease(shared->lock);
	pgjq_limits_keys_freed_hook(1, &quota->queue->queue_id, &h);
}

static void
quota_settle(PgjqClaimQuota *quota, const char *fair_key, int reserved, int picked)
{
	QuotaState *st = quota->state;
	Counter    *c;
	uint64		h;
	int32		queue_id = quota->queue->queue_id;

	if (shared == NULL || !tracking() || st->blocked)
		return;
	if (st->key_limited ? reserved == picked : picked == 0)
		return;
	h = key_hash(fair_key);
	pending_room(1);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	if (st->key_limited)
	{
		c = counter(queue_id, h, false);
		if (c)
		{
			c->running -= reserved - picked;
			shrink_reservation(queue_id, h, reserved - picked);

			/*
			 * The limit bound this key: it took all it was allowed and is
			 * full (counted even when the key had no more ready jobs than
			 * that).
			 */
			if (picked > 0 && picked == reserved &&
				c->running >= quota->queue->key_concurrency)
				st->cut_short = true;
			drop_if_idle(c);
		}
		LWLockRelease(shared->lock);
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
		Counter    *q = counter_or_error(queue_id, 0, true);

		if (q->keys_valid)
		{
			c = counter_or_error(queue_id, h, false);
			c->running += picked;
			add_pending(queue_id, h, picked, OP_COUNT);
		}
		else
		{
			q->untracked += picked;
			add_pending(queue_id, 0, picked, OP_UNTRACKED);
		}
	}
	LWLockRelease(shared->lock);
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

	hash_seq_init(&scan, counters);
	while ((c = hash_seq_search(&scan)) != NULL)
		if (c->key.dboid == MyDatabaseId && c->key.queue_id == queue_id && c->key.keyhash != 0)
			hash_search(counters, &c->key, HASH_REMOVE, NULL);
	LWLockRelease(shared->lock);
	counters_full_error();
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

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter_or_error(queue_id, 0, true);
	if (q->keys_valid || q->untracked > 0)
	{
		ready = q->keys_valid;
		LWLockRelease(shared->lock);
		return ready;
	}
	ends = q->untracked_ends;
	LWLockRelease(shared->lock);

	/* the queue's running jobs (their claims count as untracked) */
	nrk = pgjq_limits_running_keys_hook(queue_id, &rk_qids, &rk_hashes, &rk_counts);

	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter(queue_id, 0, false);
	if (q && q->keys_valid)
		ready = true;
	else if (q && q->untracked == 0 && q->untracked_ends == ends)
	{
		for (int i = 0; i < nrk; i++)
		{
			Counter    *k = counter(queue_id, rk_hashes[i], true);

			if (k == NULL)
				keys_count_full(queue_id);
			k->running += rk_counts[i];
		}
		q->keys_valid = true;
		ready = true;
	}
	LWLockRelease(shared->lock);
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
		if (!tracking() && !ensure_counted())
		{
			if (untracked_why != UNTRACKED_RECOVERY)
				untracked_error();
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
	if (shared != NULL)
		pending_room(n);
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
	if (st->blocked || npending >= maxpending)
	{
		st->cut_short = true;
		return -2;
	}
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	c = counter(queue_id, keyhash, true);
	if (c == NULL)
		r = -1;
	else if (c->running - own_ends(queue_id, keyhash) >= quota->queue->key_concurrency)
	{
		st->cut_short = true;
		drop_if_idle(c);
		r = 0;
	}
	else
	{
		c->running++;
		add_pending(queue_id, keyhash, 1, OP_COUNT);
	}
	LWLockRelease(shared->lock);
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

	if (shared == NULL || !tracking() || n <= 0 || queue->key_concurrency > 0)
		return;
	pending_room(n + 1);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	q = counter(queue->queue_id, 0, false);
	if (q && q->keys_valid)
	{
		for (int i = 0; i < n; i++)
		{
			Counter    *c = counter(queue->queue_id, hashes[i], true);

			if (c == NULL)
			{
				LWLockRelease(shared->lock);
				counters_full_error();
			}
			c->running++;
			add_pending(queue->queue_id, hashes[i], 1, OP_COUNT);
		}
	}
	else if (q)
	{
		q->untracked += n;
		add_pending(queue->queue_id, 0, n, OP_UNTRACKED);
	}
	LWLockRelease(shared->lock);
}

/* The error for pgjq_limits_ring_key_take's -1. */
void
pgjq_limits_counters_full(void)
{
	counters_full_error();
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

/*
 * Storage hook (registered by _PG_init): n jobs of (queue, key) stop
 * running at commit (fair_key NULL: keyhash is its pgjq_limits_key_hash,
 * from the ring).
 */
void
pgjq_limits_left_running(int32 queue_id, const char *fair_key, uint64 keyhash, int n)
{
	Counter    *q;
	PendingKind kind = OP_COUNT;

	if (n <= 0 || !tracking())
		return;
	pending_room(2);
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	add_pending(queue_id, 0, -n, OP_COUNT);
	q = counter(queue_id, 0, false);
	if (q && !q->keys_valid)
	{
		q->untracked += n;
		kind = OP_UNTRACKED;
	}
	if (kind == OP_UNTRACKED)
		add_pending(queue_id, 0, n, OP_UNTRACKED);
	else if (q)
	{
		keyhash = fair_key ? key_hash(fair_key) : keyhash;
		add_pending(queue_id, keyhash, -n, OP_COUNT);
	}
	LWLockRelease(shared->lock);

	/*
	 * A claim later in this transaction may use the key's room (own_ends): a
	 * ring lane parked at the key's limit must be in its ring for it
	 */
	if (kind == OP_COUNT && q)
		pgjq_limits_keys_freed_hook(1, &queue_id, &keyhash);
}

/* drop_queue: forget the queue's counters when the transaction commits. */
void
pgjq_limits_queue_dropped(int32 queue_id)
{
	if (shared == NULL || !tracking())
		return;
	pending_room(1);
	add_pending(queue_id, 0, 0, OP_DROP_QUEUE);
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
 * below subtransaction level `level` (0: the whole transaction), then wake
 * the waiters of limited queues that got room, after releasing the lock.
 */
static void
resolve(bool commit, int level)
{
	int			kept = 0;
	int			nwake = 0;
	int			nfreed = 0;
	bool		same_db;

	if (npending == 0)
		return;
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	{
		DbState    *db = db_state(MyDatabaseId);

		same_db = db && OidIsValid(db->incarnation) &&
			db->incarnation == pending_incarnation;
	}
	for (int i = 0; i < npending; i++)
	{
		PendingOp  *op = &pending[i];
		Counter    *c;
		int32		change = 0;

		/* untracked changes end with the top-level transaction only */
		if (op->level < level || (level > 0 && op->kind == OP_UNTRACKED))
		{
			pending[kept++] = *op;
			continue;
		}
		if (!same_db)
			continue;
		switch (op->kind)
		{
			case OP_COUNT:
				if (commit && op->delta < 0)
					change = op->delta;
				else if (!commit && op->delta > 0)
					change = -op->delta;
				if (change == 0)
					break;
				c = counter(op->queue_id, op->keyhash, false);
				if (c)
				{
					c->running = Max(0, c->running + change);
					if (commit && op->keyhash == 0 && c->limited)
					{
						wakeups[nwake].queue_id = op->queue_id;
						wakeups[nwake].n = -change;
						nwake++;
					}
					if (op->keyhash != 0)
					{
						freed_qids[nfreed] = op->queue_id;
						freed_hashes[nfreed] = op->keyhash;
						nfreed++;
					}
					drop_if_idle(c);
				}
				break;
			case OP_UNTRACKED:
				c = counter(op->queue_id, 0, false);
				if (c)
				{
					c->untracked = Max(0, c->untracked - op->delta);
					c->untracked_ends++;
				}
				break;
			case OP_DROP_QUEUE:
				if (commit)
					remove_entries(MyDatabaseId, op->queue_id);
				break;
		}
	}
	npending = kept;
	LWLockRelease(shared->lock);

	/* the ring's lanes parked at these keys' limits may go on (never fails) */
	if (nfreed > 0)
		pgjq_limits_keys_freed_hook(nfreed, freed_qids, freed_hashes);
	/* O(waiters) each: not under the counters' lock */
	for (int i = 0; i < nwake; i++)
		pgjq_wait_wake(MyDatabaseId, wakeups[i].queue_id, wakeups[i].n);
}

/* True when this transaction has changed the counters. */
static bool
has_pending_changes(void)
{
	for (int i = 0; i < npending; i++)
		if (pending[i].delta != 0 || pending[i].kind == OP_DROP_QUEUE)
			return true;
	return false;
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (npending > 0)
				pgjq_crash_point("commit");
			resolve(true, 0);
			npending = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			resolve(false, 0);
			npending = 0;
			break;
		case XACT_EVENT_PRE_PREPARE:

			/*
			 * The counters cannot follow a prepared transaction: its outcome
			 * comes from another session, or after a restart that the rebuild
			 * cannot see it through.
			 */
			if (has_pending_changes())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has enqueued, claimed or finished pgjq jobs"),
						 errdetail("pgjq's limit counters do not support two-phase commit.")));
			break;
		case XACT_EVENT_PREPARE:
			npending = 0;		/* only ops without effect are left */
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
	if (!tracking() && !ensure_counted())
		return false;
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
	if (shared && tracking())
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

/* verify(): running jobs expected per (queue, key), summed over sources */
typedef struct Expected
{
	int32		queue_id;
	uint64		keyhash;		/* 0: the queue */
	char	   *name;			/* the key, if known (the ring has hashes
								 * only) */
	int32		count;
} Expected;

static void
add_expected(Expected **exp, int *n, int *max, int32 queue_id, uint64 keyhash, char *name,
			 int32 count)
{
	for (int i = 0; i < *n; i++)
		if ((*exp)[i].queue_id == queue_id && (*exp)[i].keyhash == keyhash)
		{
			(*exp)[i].count += count;
			if ((*exp)[i].name == NULL)
				(*exp)[i].name = name;
			return;
		}
	if (*n == *max)
	{
		*max = *max == 0 ? 64 : *max * 2;
		*exp = *exp == NULL ? palloc(sizeof(Expected) * *max) :
			repalloc(*exp, sizeof(Expected) * *max);
	}
	(*exp)[*n].queue_id = queue_id;
	(*exp)[*n].keyhash = keyhash;
	(*exp)[*n].name = name;
	(*exp)[*n].count = count;
	(*n)++;
}

/*
 * verify(): compare this database's counters with the running jobs in
 * pgjq.job, read in the caller's SPI connection with a new snapshot.  Each
 * difference goes into *diffs (palloc'd); returns how many.  A queue whose
 * untracked changes are open is skipped (its key entries are not exact by
 * design until they end).  Nothing is compared before the database is
 * counted (the first pgjq call counts it) or without the preload.  Open
 * transactions that claimed or finished jobs show as differences until they
 * end: verify() reads again before it reports one.
 */
int
pgjq_limits_verify(PgjqLimitsDiff **diffs)
{
	typedef struct Entry
	{
		int32		queue_id;
		uint64		keyhash;
		int32		running;
		bool		keys_valid;
		bool		skip;
		int32		expected;
	} Entry;
	Entry	   *entries;
	int			nentries = 0;
	int			maxentries;
	int			ndiffs = 0;
	HASH_SEQ_STATUS scan;
	Counter    *c;
	int			nrk;
	int32	   *rk_qids;
	uint64	   *rk_hashes;
	int64	   *rk_counts;
	Expected   *exp = NULL;
	int			nexp = 0,
				maxexp = 0;

	*diffs = NULL;
	if (shared == NULL || !ensure_counted())
		return 0;
	LWLockAcquire(shared->lock, LW_SHARED);
	maxentries = hash_get_num_entries(counters) + 1;
	entries = palloc(sizeof(Entry) * maxentries);
	hash_seq_init(&scan, counters);
	while ((c = hash_seq_search(&scan)) != NULL)
	{
		if (c->key.dboid != MyDatabaseId)
			continue;
		entries[nentries].queue_id = c->key.queue_id;
		entries[nentries].keyhash = c->key.keyhash;
		entries[nentries].running = c->running;
		entries[nentries].keys_valid = c->keys_valid;
		entries[nentries].skip = c->untracked > 0;
		entries[nentries].expected = 0;
		nentries++;
	}
	LWLockRelease(shared->lock);

	/*
	 * the ring's (queue, key) pairs and the entries: room for every
	 * difference
	 */
	nrk = pgjq_limits_running_keys_hook(0, &rk_qids, &rk_hashes, &rk_counts);
	*diffs = palloc(sizeof(PgjqLimitsDiff) * (nrk + nentries + 1));

	/* expected per queue: the ring's running jobs */
	for (int i = 0; i < nrk; i++)
		add_expected(&exp, &nexp, &maxexp, rk_qids[i], 0, NULL, (int32) rk_counts[i]);
	/* and per key: the ring knows its keys by hash only */
	for (int i = 0; i < nrk; i++)
		add_expected(&exp, &nexp, &maxexp, rk_qids[i], rk_hashes[i], NULL, (int32) rk_counts[i]);

	for (int x = 0; x < nexp; x++)
	{
		Expected   *ex = &exp[x];
		Entry	   *q = NULL;
		Entry	   *k = NULL;

		for (int e = 0; e < nentries; e++)
		{
			if (entries[e].queue_id != ex->queue_id)
				continue;
			if (entries[e].keyhash == 0)
				q = &entries[e];
			else if (entries[e].keyhash == ex->keyhash)
				k = &entries[e];
		}
		if (ex->keyhash == 0)
		{
			if (q != NULL)
				q->expected = ex->count;
			else if (ex->count > 0)
			{
				/* running jobs of a queue the counters do not know */
				(*diffs)[ndiffs].queue_id = ex->queue_id;
				(*diffs)[ndiffs].fair_key = NULL;
				(*diffs)[ndiffs].expected = ex->count;
				(*diffs)[ndiffs].found = 0;
				ndiffs++;
			}
			continue;
		}
		/* a key: compared when the queue's keys are tracked and settled */
		if (q == NULL || !q->keys_valid || q->skip)
			continue;
		if (k == NULL || k->running != ex->count)
		{
			(*diffs)[ndiffs].queue_id = ex->queue_id;
			(*diffs)[ndiffs].fair_key = ex->name ? ex->name :
				psprintf("(key hash %016llx)", (unsigned long long) ex->keyhash);
			(*diffs)[ndiffs].expected = ex->count;
			(*diffs)[ndiffs].found = k ? k->running : 0;
			ndiffs++;
		}
		if (k != NULL)
			k->skip = true;		/* compared */
	}
	for (int e = 0; e < nentries; e++)
	{
		Entry	   *en = &entries[e];
		bool		queue_skipped = false;

		if (en->keyhash != 0)
		{
			/* a key entry no running job matched */
			for (int f = 0; f < nentries; f++)
				if (entries[f].queue_id == en->queue_id && entries[f].keyhash == 0 &&
					(entries[f].skip || !entries[f].keys_valid))
					queue_skipped = true;
			if (en->skip || queue_skipped || en->running == 0)
				continue;
			(*diffs)[ndiffs].queue_id = en->queue_id;
			(*diffs)[ndiffs].fair_key = psprintf("(key hash %016llx)", (unsigned long long) en->keyhash);
			(*diffs)[ndiffs].expected = 0;
			(*diffs)[ndiffs].found = en->running;
			ndiffs++;
			continue;
		}
		if (en->running != en->expected)
		{
			(*diffs)[ndiffs].queue_id = en->queue_id;
			(*diffs)[ndiffs].fair_key = NULL;
			(*diffs)[ndiffs].expected = en->expected;
			(*diffs)[ndiffs].found = en->running;
			ndiffs++;
		}
	}
	return ndiffs;
}
