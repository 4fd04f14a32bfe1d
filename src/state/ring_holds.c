/*-------------------------------------------------------------------------
 *
 * ring_holds.c
 *	  The held fair keys in shared memory: the ring_holds table, which keys
 *	  of which queue claims skip until when, changed at commit.  The SQL
 *	  functions are in api/key_hold.c, the durable rows (pgjq.key_holds) in
 *	  engine/key_holds.c.
 *
 * Holding a fair key of a queue until a time: hold_key(queue, fair_key,
 * until), release_key(queue, fair_key), and fail(..., hold_key_for) for a
 * worker told to come back later (an HTTP 429 with Retry-After).
 *
 * Claims skip a held key's ready ring jobs without touching them: the
 * key's lanes stay out of their queue's round robin (ring_lane_settle asks
 * ring_lane_held), so no attempt is spent and nothing is written per job.
 * The hold is one row of pgjq.key_holds, written by the call, and one entry
 * of the shared ring_holds table (pgjq.ring_max_holds entries), which takes
 * the change when the transaction commits (an abort, or the abort of the
 * savepoint that made it, leaves the entry as it was).  Two changes of one
 * key are serialized by the row's lock, so an entry has at most one pending
 * change.  When a hold ends the next claim of the database puts the key's
 * lanes back (ring_holds_expire), and a waiting claim sleeps no longer
 * than until the earliest end (pgjq_ring_hold_next); a release wakes the
 * queue's waiting claims at its commit.  After a start or a crash the
 * ring's rebuild loads the rows still in the future (ring_holds_load).
 *
 * Locking: ring->lock (ring_internal.h) guards ring_holds and the database
 * record's counters.  The fast path of a claim reads one counter
 * (ring->nholds) when no key is held anywhere.
 *
 * A claim in the transaction that enqueued a job of a held key still gets
 * it (its own pending jobs are in no lane).
 *
 *-------------------------------------------------------------------------
 */
#include "state/ring_holds.h"
#include "state/ring_internal.h"
#include "state/limits.h"
#include "state/wait.h"
#include "common/crash_points.h"
#include "common/guc.h"

#include "access/transam.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "storage/procarray.h"
#include "utils/memutils.h"

/* this transaction's changed entries, applied at commit */
typedef struct PendingHold
{
	RingHoldKey key;
	int			level;			/* subtransaction nesting level */
	bool		prev_pending;	/* this transaction had changed it before */
	TimestampTz prev_new_until; /* ... to this */
} PendingHold;

static PendingHold *pending = NULL;
static TransactionId pending_xid = InvalidTransactionId;	/* whose they are */
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks = false;

void
ring_hold_key_of(RingHoldKey *k, int32 queue_id, const char *fair_key)
{
	memset(k, 0, sizeof(*k));
	k->dbid = MyDatabaseId;
	k->queue_id = queue_id;
	/* the lanes' hash of the key: 0 for the jobs without one */
	k->keyhash = fair_key[0] ? pgjq_limits_key_hash(fair_key, strlen(fair_key)) : 0;
}

/* Put the key's lanes where they belong now (lock held exclusively). */
void
ring_holds_settle_key(int32 queue_id, uint64 keyhash)
{
	RingQueue  *q = ring_queue_get(queue_id, false);

	if (q == NULL)
		return;
	for (RingPrio *r = q->prios, *next; r != NULL; r = next)
	{
		RingLaneKey k;
		RingLane   *l;

		/* settling the lane may drop its priority's ring */
		next = r->next;
		memset(&k, 0, sizeof(k));
		k.dbid = MyDatabaseId;
		k.queue_id = queue_id;
		k.keyhash = keyhash;
		k.priority = r->key.priority;
		l = hash_search(ring_lanes, &k, HASH_FIND, NULL);
		if (l != NULL)
			ring_lane_settle(l);
	}
}

/*
 * Up to max lanes of the queue with ready jobs that a hold (or a key_rate)
 * keeps out of the round robin (lock held exclusively): for purge and
 * drop_queue, which end every ready job.  One walk of the lane table per
 * call, so a caller takes them for a whole chunk of jobs at once.
 */
int
ring_holds_held_lanes(RingQueue *q, RingLane **out, int max)
{
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	int			n = 0;

	/* held, or throttled at a key_rate (key_rate.c) */
	if (ring->nholds == 0 && !ring_rates_any())
		return 0;
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
		if (l->queue == q && l->count > 0 && !l->linked)
		{
			out[n++] = l;
			if (n == max)
			{
				hash_seq_term(&hs);
				break;
			}
		}
	return n;
}

static void
remove_hold(RingDb *db, RingHold *h)
{
	hash_search(ring_holds, &h->key, HASH_REMOVE, NULL);
	ring->nholds--;
	db->nholds--;
}

/*
 * Recompute the database's earliest hold end after now (lock held).  An
 * ended hold that a transaction is still changing is left to its commit or
 * abort, so a waiting claim never sleeps until a time already past.
 */
static void
reset_next(RingDb *db, TimestampTz now)
{
	HASH_SEQ_STATUS hs;
	RingHold   *h;

	db->hold_next = DT_NOEND;
	if (db->nholds == 0)
		return;
	hash_seq_init(&hs, ring_holds);
	while ((h = hash_seq_search(&hs)) != NULL)
		if (h->key.dbid == db->dbid && h->until > now && h->until < db->hold_next)
			db->hold_next = h->until;
}

/*
 * Ended holds of the database out of the table, their keys' lanes back into
 * the round robin (lock held exclusively; a claim calls it).
 */
void
ring_holds_expire(RingDb *db, TimestampTz now)
{
	HASH_SEQ_STATUS hs;
	RingHold   *h;

	if (db->nholds == 0 || now < db->hold_next)
		return;
	hash_seq_init(&hs, ring_holds);
	while ((h = hash_seq_search(&hs)) != NULL)
		if (h->key.dbid == db->dbid && h->until > 0 && h->until <= now &&
			!TransactionIdIsValid(h->xid))
		{
			int32		queue_id = h->key.queue_id;
			uint64		keyhash = h->key.keyhash;

			remove_hold(db, h);
			ring_holds_settle_key(queue_id, keyhash);
		}
	reset_next(db, now);
}

/*
 * Before a claim looks for lanes: put back the lanes of the database's
 * holds that have ended.  No key held anywhere: one unlocked read.
 */
void
ring_holds_expire_due(void)
{
	RingDb	   *db;
	bool		due;
	TimestampTz now;

	if (ring == NULL || ring->nholds == 0)
		return;
	now = GetCurrentTimestamp();
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	due = db != NULL && db->nholds > 0 && now >= db->hold_next;
	LWLockRelease(ring->lock);
	if (!due)
		return;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db_find();
	if (db != NULL)
		ring_holds_expire(db, now);
	LWLockRelease(ring->lock);
}

/*
 * Commit (level 0): every change takes effect.  Abort of the (sub)transaction
 * at `level`: its changes are undone, latest first, each entry back to what
 * it was before (a change this transaction made earlier, or none).
 */
static void
apply(bool commit, int level)
{
	RingDb	   *db;
	int			kept = npending;

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db_find();
	if (!commit)
	{
		while (kept > 0 && pending[kept - 1].level >= level)
		{
			PendingHold *p = &pending[--kept];
			RingHold   *h = db ? hash_search(ring_holds, &p->key, HASH_FIND, NULL) : NULL;

			/* a later transaction's change (after our end): not ours to undo */
			if (h == NULL || h->xid != pending_xid)
				continue;
			if (p->prev_pending)
				h->new_until = p->prev_new_until;
			else
			{
				h->xid = InvalidTransactionId;
				if (h->until == 0)
					remove_hold(db, h); /* made by the undone change */
			}
		}
	}
	else
	{
		for (int i = 0; i < npending; i++)
		{
			RingHold   *h = db ? hash_search(ring_holds, &pending[i].key, HASH_FIND, NULL) : NULL;

			/*
			 * Only our own change: an earlier change of the same key applied
			 * it, or a transaction that locked the row after our commit was
			 * visible took it on for us (note_change) and its own change is
			 * pending now.
			 */
			if (h == NULL || h->xid != pending_xid)
				continue;
			h->xid = InvalidTransactionId;
			h->until = h->new_until;
			if (h->until == 0)
				remove_hold(db, h);
			ring_holds_settle_key(pending[i].key.queue_id, pending[i].key.keyhash);
		}
		kept = 0;
		if (db != NULL)
			reset_next(db, GetCurrentTimestamp());
	}
	LWLockRelease(ring->lock);
	npending = kept;
}

static void
hold_xact_callback(XactEvent event, void *arg)
{
	if (npending == 0)
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that held or released a pgjq key"),
					 errdetail("A hold takes effect in shared memory when its transaction commits in the session that ran it.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			pgjq_crash_point("commit");
			apply(true, 0);
			npending = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			apply(false, 0);
			npending = 0;
			break;
		default:
			break;
	}
}

static void
hold_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	if (npending == 0)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		apply(false, level);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		for (int i = 0; i < npending; i++)
			if (pending[i].level >= level)
				pending[i].level = level - 1;
}

/*
 * Note a change of the key's entry, to take effect at commit: a hold until
 * `until`, or a release (0).  Called after the durable row was written (so
 * holding its lock).  The room check comes first: nothing is half-done.
 */
void
ring_holds_note_change(int32 queue_id, const char *fair_key, TimestampTz until)
{
	RingHoldKey k;
	RingHold   *h;
	RingDb	   *db;
	bool		found;
	TransactionId xid = GetTopTransactionId();
	TransactionId other;
	bool		other_committed;

	if (!callbacks)
	{
		RegisterXactCallback(hold_xact_callback, NULL);
		RegisterSubXactCallback(hold_subxact_callback, NULL);
		callbacks = true;
	}
	if (npending == maxpending)
	{
		int			newmax = Max(8, maxpending * 2);

		pending = pending ? repalloc(pending, sizeof(PendingHold) * newmax) :
			MemoryContextAlloc(TopMemoryContext, sizeof(PendingHold) * newmax);
		maxpending = newmax;
	}
	ring_hold_key_of(&k, queue_id, fair_key);

	/*
	 * Another transaction's change of the key, not taken on yet: it has ended
	 * (we hold the row it changed), but its commit or abort callback may not
	 * have run.  Its fate is read here, without the ring's lock, and a
	 * committed change is taken on for it below, so that the entry holds only
	 * our change pending (and its callback leaves the entry alone).
	 */
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	h = db ? hash_search(ring_holds, &k, HASH_FIND, NULL) : NULL;
	other = h != NULL && TransactionIdIsValid(h->xid) && h->xid != xid ?
		h->xid : InvalidTransactionId;
	LWLockRelease(ring->lock);
	/* (it cannot be running: never take on what it may still change) */
	if (TransactionIdIsValid(other) && TransactionIdIsInProgress(other))
		other = InvalidTransactionId;
	other_committed = TransactionIdIsValid(other) && TransactionIdDidCommit(other);

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	h = db ? hash_search(ring_holds, &k, until > 0 ? HASH_ENTER_NULL : HASH_FIND, &found) : NULL;
	if (h != NULL && found && TransactionIdIsValid(other) && h->xid == other)
	{
		if (other_committed)
		{
			h->until = h->new_until;
			ring_holds_settle_key(queue_id, k.keyhash);
		}
		h->xid = InvalidTransactionId;
		reset_next(db, GetCurrentTimestamp());
	}
	if (h == NULL)
	{
		LWLockRelease(ring->lock);
		if (until == 0)
			return;				/* a release of a key held by no entry */
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more held keys (%d)", pgjq_ring_max_holds),
				 errhint("Release held keys, or raise pgjq.ring_max_holds and restart the server.")));
	}
	if (until > 0 && !found)
	{
		h->until = 0;
		h->xid = InvalidTransactionId;
		ring->nholds++;
		db->nholds++;
	}
	/* this transaction changed the key before */
	pending[npending].prev_pending = TransactionIdIsValid(h->xid);
	pending[npending].prev_new_until = h->new_until;
	h->new_until = until;
	h->xid = xid;
	LWLockRelease(ring->lock);
	pending[npending].key = k;
	pending[npending].level = GetCurrentTransactionNestLevel();
	pending_xid = xid;
	npending++;
}

TimestampTz
pgjq_ring_hold_next(void)
{
	RingDb	   *db;
	TimestampTz t = DT_NOEND;

	if (ring == NULL)
		return t;
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	if (db != NULL && db->nholds > 0)
		t = db->hold_next;
	/* and the next token of a key at its key_rate */
	t = Min(t, ring_rates_next());
	LWLockRelease(ring->lock);
	return t;
}

int64
ring_holds_install(RingDb *db, const RingHoldRow *rows, int n)
{
	int64		skipped = 0;

	for (int i = 0; i < n; i++)
	{
		RingHoldKey k;
		RingHold   *h;
		bool		found;

		memset(&k, 0, sizeof(k));
		k.dbid = db->dbid;
		k.queue_id = rows[i].queue_id;
		k.keyhash = rows[i].keyhash;
		h = hash_search(ring_holds, &k, HASH_ENTER_NULL, &found);
		if (h == NULL)
		{
			skipped++;
			continue;
		}
		if (!found)
		{
			ring->nholds++;
			db->nholds++;
		}
		h->until = h->new_until = rows[i].until;
		h->xid = InvalidTransactionId;
		if (h->until < db->hold_next)
			db->hold_next = h->until;
	}
	/* the caller reports them, once it released the lock */
	return skipped;
}
