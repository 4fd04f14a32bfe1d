/*-------------------------------------------------------------------------
 *
 * limits.c
 *	  The counters behind the concurrency limits (per queue and per fair
 *	  key) and rate limits (per queue): their shared memory, the count of a
 *	  database's running jobs after a start, and the changes of each
 *	  transaction, applied or undone when it ends.  Exact across every
 *	  backend.
 *
 * Files: this one owns the shared memory and the transaction's pending
 * changes; limits_claim.c (what a claim may take: the queue's concurrency
 * and rate, the per-key quota, await()'s readings) and limits_verify.c
 * (verify(), _limits(), _preloaded()) use them through limits_internal.h,
 * never the other way round.
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
 * may use the room of jobs its own transaction has ended (limits_own_ends()):
 * both commit or abort together, which is what a worker's fused cycle
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
 * the first key-limited claim (limits_claim.c).  Until then, claims and
 * finished jobs of the queue are "untracked": the queue entry counts those
 * of open transactions (untracked) and how many such transactions ended
 * (untracked_ends).  The key count is taken only when no untracked change is
 * open and none ended while counting, so it is exact; otherwise that claim
 * gets nothing from the queue this time (held back), which is safe.
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
 * (pgjq_limits_ring_key_take, limits_claim.c; the order is always ring lock,
 * then this one), and parks a lane whose key is full; every decrement of a
 * key count calls pgjq_ring_keys_freed after this lock is released, so the
 * lane comes back.
 *
 * Order of operations of a call: the begin hook makes sure the database is
 * counted (limits_ensure_counted, which also registers the transaction
 * callbacks once); each change then takes room for its pending op before the
 * lock (limits_pending_room, which may allocate), changes the entries under
 * the lock and records the op (limits_add_pending); at commit or abort of
 * the (sub)transaction resolve() applies or undoes the ops, then, with no
 * lock held, brings back the ring's parked lanes and wakes the waiters.
 *
 * Locking: counter_lock (one LWLock, limits_shared->lock) guards the hash
 * and the database table; it is held only for a few hash operations, never
 * across SQL or catalog access.  Waiters are woken after it is released.
 *
 *-------------------------------------------------------------------------
 */
#include "state/limits.h"
#include "state/limits_internal.h"
#include "common/guc.h"
#include "state/wait.h"
#include "common/spi_plans.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "common/crash_points.h"
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

LimitsShared *limits_shared = NULL;
HTAB	   *limits_counters = NULL;

/* Pending changes of this backend's open transaction. */
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
 * limits_ensure_counted() at the start of every pgjq call, InvalidOid when
 * the database is not tracked (then limits_untracked_why says why).
 */
Oid			limits_pending_incarnation = InvalidOid;

UntrackedWhy limits_untracked_why = UNTRACKED_RECOVERY;
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

	limits_shared = ShmemInitStruct("pgjq limits", shared_size(), &sfound);
	if (!sfound)
	{
		memset(limits_shared, 0, shared_size());
		limits_shared->lock = &(GetNamedLWLockTranche("pgjq"))[1].lock;
		limits_shared->ndbs = pgjq_max_databases;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(CounterKey);
	info.entrysize = sizeof(Counter);

	/*
	 * HASH_FIXED_SIZE: never take more from the shared reserve, which the
	 * lock manager needs; a full table fails the claim that needs an entry.
	 */
	limits_counters = ShmemInitHash("pgjq counters", pgjq_max_tracked_keys, pgjq_max_tracked_keys,
									&info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/* A fair key's counter hash; never 0 (that is the queue's own entry). */
uint64
pgjq_limits_key_hash(const char *fair_key, int len)
{
	uint64		h = hash_bytes_extended((const unsigned char *) fair_key, len, 0x706a71);

	return h == 0 ? 1 : h;
}

/* Raise object_not_in_prerequisite_state when pgjq was not preloaded. */
void
pgjq_limits_require_shmem(const char *what)
{
	if (limits_shared == NULL)
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

/* The database's slot, or NULL; caller holds the lock. */
static DbState *
db_state(Oid dboid)
{
	for (int i = 0; i < limits_shared->ndbs; i++)
		if (limits_shared->dbs[i].dboid == dboid)
			return &limits_shared->dbs[i];
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

	hash_seq_init(&scan, limits_counters);
	while ((c = hash_seq_search(&scan)) != NULL)
		if (c->key.dboid == dboid && (queue_id == 0 || c->key.queue_id == queue_id))
			hash_search(limits_counters, &c->key, HASH_REMOVE, NULL);
}

/*
 * Free the slots and counter entries of databases that were dropped.  Needs
 * a transaction (pg_database is read through the syscache); caller does not
 * hold the lock.  True if anything was freed.
 */
static bool
forget_gone_databases(void)
{
	Oid		   *dbs = palloc(sizeof(Oid) * limits_shared->ndbs);
	int			n = 0;
	int			ngone = 0;

	LWLockAcquire(limits_shared->lock, LW_SHARED);
	for (int i = 0; i < limits_shared->ndbs; i++)
		if (OidIsValid(limits_shared->dbs[i].dboid) && limits_shared->dbs[i].dboid != MyDatabaseId)
			dbs[n++] = limits_shared->dbs[i].dboid;
	LWLockRelease(limits_shared->lock);

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

	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
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
	LWLockRelease(limits_shared->lock);
	pfree(dbs);
	return true;
}

/* The counter entry; caller holds the lock exclusively.  NULL if full. */
Counter *
limits_counter(int32 queue_id, uint64 keyhash, bool create)
{
	CounterKey	key = {MyDatabaseId, queue_id, keyhash};
	bool		found;
	Counter    *c;

	c = hash_search(limits_counters, &key, create ? HASH_ENTER_NULL : HASH_FIND, &found);
	if (c && !found)
	{
		memset(((char *) c) + sizeof(CounterKey), 0, sizeof(Counter) - sizeof(CounterKey));
		c->tokens = -1;			/* bucket not filled yet */
	}
	return c;
}

void
limits_counters_full_error(void)
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
Counter *
limits_counter_or_error(int32 queue_id, uint64 keyhash, bool may_gc)
{
	Counter    *c = limits_counter(queue_id, keyhash, true);

	if (c == NULL && may_gc)
	{
		bool		freed;

		LWLockRelease(limits_shared->lock);
		freed = forget_gone_databases();
		LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
		if (freed)
			c = limits_counter(queue_id, keyhash, true);
	}
	if (c == NULL)
	{
		LWLockRelease(limits_shared->lock);
		limits_counters_full_error();
	}
	return c;
}

/* Error for a limited queue in a database whose counters are not kept. */
void
limits_untracked_error(void)
{
	if (limits_untracked_why == UNTRACKED_NO_SLOT)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("pgjq tracks limits in at most %d databases", pgjq_max_databases),
				 errdetail("Queues with limits cannot be used in this database until a database that uses them is dropped."),
				 errhint("Raise pgjq.max_databases.")));
	limits_counters_full_error();
}

static PgjqPlan plan_key_limited = {
	"SELECT queue_id FROM pgjq.queue WHERE key_concurrency > 0",
	0, {InvalidOid}
};

/*
 * Count this database's running jobs into its counters (its slot is
 * invalid).  Caller holds the rebuild lock of the database.  False when no
 * slot is free or the table is full (limits_untracked_why says which).
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
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	db = db_state_create(MyDatabaseId);
	if (db == NULL)
	{
		LWLockRelease(limits_shared->lock);
		limits_untracked_why = UNTRACKED_NO_SLOT;
		return false;
	}
	db->incarnation = InvalidOid;
	remove_entries(MyDatabaseId, 0);
	LWLockRelease(limits_shared->lock);

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

	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	db = db_state(MyDatabaseId);
	for (int i = 0; db && i < nrk && !full; i++)
	{
		Counter    *q = limits_counter(rk_qids[i], 0, true);

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
		q = limits_counter(rk_qids[i], 0, true);
		k = q == NULL ? NULL : limits_counter(rk_qids[i], rk_hashes[i], true);
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
	LWLockRelease(limits_shared->lock);
	SPI_finish();
	if (full)
		limits_untracked_why = UNTRACKED_FULL;
	return db != NULL && !full;
}

/*
 * Make sure this database's counters describe pgjq.job, counting them if
 * not, and set limits_pending_incarnation for this call.  Caller is in a
 * transaction with the extension present.  False when the database is not
 * tracked: in recovery (nothing can change jobs there, and a count taken
 * there would be stale after promotion), or when it has no slot or the table
 * is full (tried again after a second).
 */
bool
limits_ensure_counted(void)
{
	Oid			incarnation;
	DbState    *db;
	bool		valid;
	LOCKTAG		tag;

	if (limits_shared == NULL)
		return false;
	register_callbacks();
	if (RecoveryInProgress())
	{
		limits_untracked_why = UNTRACKED_RECOVERY;
		limits_pending_incarnation = InvalidOid;
		return false;
	}
	incarnation = get_relname_relid("job", get_namespace_oid("pgjq", false));

	/*
	 * Once counted, a database stays valid until a new incarnation (seen
	 * here) or a restart (a new process): no need for the lock then.
	 */
	if (OidIsValid(incarnation) && incarnation == known_valid)
	{
		limits_pending_incarnation = incarnation;
		return true;
	}
	LWLockAcquire(limits_shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId);
	valid = db && OidIsValid(db->incarnation) && db->incarnation == incarnation;
	LWLockRelease(limits_shared->lock);
	if (valid)
	{
		limits_pending_incarnation = known_valid = incarnation;
		return true;
	}
	limits_pending_incarnation = InvalidOid;
	if (retry_count_at != 0 && GetCurrentTimestamp() < retry_count_at)
		return false;

	/* serialize rebuilders of this database; others wait here */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, PGJQ_LOCKTAG_REBUILD);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);

	LWLockAcquire(limits_shared->lock, LW_SHARED);
	db = db_state(MyDatabaseId);
	valid = db && OidIsValid(db->incarnation) && db->incarnation == incarnation;
	LWLockRelease(limits_shared->lock);
	if (!valid)
		valid = count_database(incarnation);
	LockRelease(&tag, ExclusiveLock, false);

	retry_count_at = valid ? 0 : GetCurrentTimestamp() + USECS_PER_SEC;
	if (valid)
		limits_pending_incarnation = known_valid = incarnation;
	return valid;
}

/*
 * The begin hook of the storage engine (registered by _PG_init): before any
 * statement of a call.
 */
void
pgjq_limits_storage_begin(void)
{
	(void) limits_ensure_counted();
}

/*
 * Make sure this database's counters describe pgjq.job, counting them if
 * not (the worker calls it when it starts).
 */
void
pgjq_limits_rebuild_if_needed(void)
{
	(void) limits_ensure_counted();
}

void
limits_drop_if_idle(Counter *c)
{
	if (c->key.keyhash != 0 && c->running <= 0)
		hash_search(limits_counters, &c->key, HASH_REMOVE, NULL);
}

/* Make room for n more pending ops (before taking the lock). */
void
limits_pending_room(int n)
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

/* Record a pending op; room was made with limits_pending_room() before the lock. */
void
limits_add_pending(int32 queue_id, uint64 keyhash, int32 delta, PendingKind kind)
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
void
limits_shrink_reservation(int32 queue_id, uint64 keyhash, int32 n)
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
int32
limits_own_ends(int32 queue_id, uint64 keyhash)
{
	int32		n = 0;

	for (int i = 0; i < npending; i++)
		if (pending[i].kind == OP_COUNT && pending[i].queue_id == queue_id &&
			pending[i].keyhash == keyhash && pending[i].delta < 0)
			n -= pending[i].delta;
	return n;
}

/*
 * True when no pending op can be recorded without limits_pending_room()
 * (which may allocate: not under another lock).
 */
bool
limits_pending_full(void)
{
	return npending >= maxpending;
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

	if (n <= 0 || !limits_tracking())
		return;
	limits_pending_room(2);
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	limits_add_pending(queue_id, 0, -n, OP_COUNT);
	q = limits_counter(queue_id, 0, false);
	if (q && !q->keys_valid)
	{
		q->untracked += n;
		kind = OP_UNTRACKED;
	}
	if (kind == OP_UNTRACKED)
		limits_add_pending(queue_id, 0, n, OP_UNTRACKED);
	else if (q)
	{
		keyhash = fair_key ? limits_fair_key_hash(fair_key) : keyhash;
		limits_add_pending(queue_id, keyhash, -n, OP_COUNT);
	}
	LWLockRelease(limits_shared->lock);

	/*
	 * A claim later in this transaction may use the key's room
	 * (limits_own_ends): a ring lane parked at the key's limit must be in its
	 * ring for it
	 */
	if (kind == OP_COUNT && q)
		pgjq_limits_keys_freed_hook(1, &queue_id, &keyhash);
}

/* drop_queue: forget the queue's counters when the transaction commits. */
void
pgjq_limits_queue_dropped(int32 queue_id)
{
	if (limits_shared == NULL || !limits_tracking())
		return;
	limits_pending_room(1);
	limits_add_pending(queue_id, 0, 0, OP_DROP_QUEUE);
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
	LWLockAcquire(limits_shared->lock, LW_EXCLUSIVE);
	{
		DbState    *db = db_state(MyDatabaseId);

		same_db = db && OidIsValid(db->incarnation) &&
			db->incarnation == limits_pending_incarnation;
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
				c = limits_counter(op->queue_id, op->keyhash, false);
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
					limits_drop_if_idle(c);
				}
				break;
			case OP_UNTRACKED:
				c = limits_counter(op->queue_id, 0, false);
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
	LWLockRelease(limits_shared->lock);

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
