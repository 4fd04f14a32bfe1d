/*-------------------------------------------------------------------------
 *
 * ring_xact.c
 *	  What a transaction does to the ring, noted locally (jobs enqueued,
 *	  claimed, closed, purged, heartbeated, relocated; slots written,
 *	  marked or truncated; queues whose pgjq.job rows it touched, whose
 *	  limits it changed or which it dropped), and the commit, abort and
 *	  subtransaction callbacks that publish it or undo it in the records of
 *	  ring_records.c.
 *
 * Order: a call reserves room for its local notes first (ring_reserve_*),
 * then changes the shared records under the lock and notes what it did
 * (ring_note_*), which never allocates.  At commit the callback publishes
 * every note under one exclusive hold of the lock; at abort it undoes them,
 * newest first; a subtransaction's abort undoes its level's, its commit
 * hands them to its parent.  The callbacks never allocate and never fail
 * (ring_internal.h, I6): node room and lanes are reserved when a job is
 * appended, and in-flight entries exist from the claim on.
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
#include "state/ring_xact.h"
#include "state/ring_internal.h"
#include "state/worker_slots.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "common/crash_points.h"
#include "miscadmin.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

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
 * (engine/ring_relocate.c's relocation): when it commits, their lane node or in-flight
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
				ring_slot_left(db, r->from, GetTopTransactionIdIfAny());
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
			ring_flight_take_reloc(db, f);
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
		ring_claim_ended(f);
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
		ring_flight_take_reloc(ring_db_find(), f);
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
				ring_flight_take_reloc(ring_db_find(), f);
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
			ring_flight_take_reloc(ring_db_find(), f);
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
					ring_claim_ended(f);
					f->pending = false;
					ring_flight_take_reloc(db, f);
				}
			}
			for (int i = 0; i < n_close; i++)
			{
				RingFlight *f = ring_flight_find(p_close[i].id);

				if (f != NULL && f->state == RF_CLOSING)
				{
					RingLane   *l = f->lane;

					if (db)
						ring_slot_left(db, f->slot, GetTopTransactionIdIfAny());
					l->running--;
					l->queue->running--;
					if (p_close[i].was_claiming)
						ring_claim_ended(f);
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
					ring_flight_take_reloc(db, f);
					reopened(f);
				}
			}
			for (int i = 0; i < n_drop; i++)
			{
				RingLane   *l = p_drop[i].lane;

				if (db)
					ring_slot_left(db, p_drop[i].p.slot, GetTopTransactionIdIfAny());
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
