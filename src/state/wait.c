/*-------------------------------------------------------------------------
 *
 * wait.c
 *	  Waiting claims: backends sleep on their latch until a job of one of
 *	  their queues becomes claimable; producers wake them at commit.
 *
 * Shared state is one record per PGPROC slot: the queues the backend waits
 * for, whether it is waiting, its arrival order, and the queues whose
 * wake-up it holds.  A transaction that makes n jobs of a queue claimable
 * (enqueue, promote, retry_dead, resume, alter_queue raising or removing a
 * limit, a finished job freeing capacity under a limit, a claim that locked
 * more rows than it took) notes it; when it commits, the n longest-waiting
 * backends of that queue are marked woken and their latches set.  A claim
 * also notes the jobs it locks: if its transaction or subtransaction aborts,
 * they are claimable again, and that many waiters are woken then.  So the
 * wake-up never precedes visibility, rolled-back work wakes no one, and n
 * jobs wake about n waiters, not all.  Both kinds of wake-up are sent from a
 * resource-release callback, after every transaction callback: at commit
 * after the catalog invalidations, so a woken claim sees a queue's new
 * settings; at abort after the ring's abort callback (ring_xact.c) has
 * given the claimed jobs back.  Woken from an abort callback, a quick waiter
 * could look before that (the callbacks run newest first, and the ring's is
 * registered first), find the job still held, use up its wake-up and sleep
 * to the end of its wait (test/t/052_wait_rollback.pl).
 *
 * A waiter registers before its first claim attempt, so a commit that its
 * attempt's snapshot missed still finds it registered and sets its latch.
 * A woken waiter claims again; if another claimer got there first it re-arms
 * and sleeps for the rest of its wait.  A wake-up is used up only by an
 * attempt that looked at that queue: a waiter that leaves holding one (it
 * filled its batch from an earlier queue, was cancelled, its wait ended, or
 * it is an await() caller, which takes no job itself) hands it on to the
 * next waiter of that queue.  An await() caller that returns because a queue
 * is ready hands it on only to a waiting claim, so that one job does not
 * wake every await() caller in turn.  No NOTIFY, no polling.
 *
 * PREPARE TRANSACTION of a transaction with notes is refused (0A000): the
 * wake-ups would have to happen at a COMMIT PREPARED in another session.
 *
 * Locking: wait_lock guards the records; nwaiting lets producers skip it
 * when nobody waits.  Callers must not hold limits.c's lock.
 *
 *-------------------------------------------------------------------------
 */
#include "state/wait.h"
#include "common/crash_points.h"
#include "common/guc.h"
#include "common/wait_events.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"


#define JOBMASK_WORDS	4		/* 256 bits: id hash -> bit */

typedef struct Waiter
{
	Oid			dboid;
	bool		waiting;
	bool		await;			/* an await() caller: it takes no job */
	int			nqueues;
	uint32		woken;			/* wake-ups held: bit i for queue_ids[i] */
	uint64		seq;
	int32		queue_ids[PGJQ_WAIT_MAX_QUEUES];
	/* wait_jobs(): waiting for jobs whose id hashes to a bit of jobmask */
	bool		jobs_waiting;
	uint64		jobmask[JOBMASK_WORDS];
} Waiter;

StaticAssertDecl(PGJQ_WAIT_MAX_QUEUES <= 32, "Waiter.woken has one bit per queue");

typedef struct WaitShared
{
	LWLock	   *lock;
	pg_atomic_uint32 nwaiting;
	pg_atomic_uint32 njobwaiting;	/* wait_jobs() callers */
	uint64		next_seq;
	int			nslots;
	Waiter		waiters[FLEXIBLE_ARRAY_MEMBER];
} WaitShared;

static WaitShared *wshared = NULL;
static bool registered = false;
static bool exit_hook_set = false;
static bool leaving_ready = false;	/* await() returns: a queue is ready */

/*
 * Queues this transaction made claimable, to wake at commit (at_abort
 * false), and jobs its claims locked, to wake if the (sub)transaction at
 * `level` aborts (at_abort true).
 */
typedef struct ReadyNote
{
	int32		queue_id;
	bool		at_abort;
	bool		aborted;		/* at_abort: its level aborted; wake soon */
	int			level;			/* at_abort: subtransaction nesting level */
	int64		n;
} ReadyNote;

static ReadyNote *notes = NULL;
static int	nnotes = 0;
static int	maxnotes = 0;
static bool callback_registered = false;
static bool committed = false;	/* commit notes wait for the invalidations */
static bool aborted = false;	/* abort notes wait for the ring's undo */

/* jobs this transaction finished (their id bits), for wait_jobs() callers */
static uint64 finished_mask[JOBMASK_WORDS];
static bool finished_any = false;
static bool jobs_registered = false;

static void sleep_until(TimestampTz until, PgjqWaitEvent event);
static void register_callbacks(void);
static void wake_job_waiters(void);

/* set by _PG_init (wait.h) */
PgjqJobFinishedHook pgjq_wait_finished_hook = NULL;

static int
slot_count(void)
{
	/* every PGPROC: backends, auxiliary processes, prepared transactions */
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

Size
pgjq_wait_shmem_size(void)
{
	return add_size(offsetof(WaitShared, waiters), mul_size(slot_count(), sizeof(Waiter)));
}

void
pgjq_wait_shmem_init(bool found_unused)
{
	bool		found;

	wshared = ShmemInitStruct("pgjq waiters", pgjq_wait_shmem_size(), &found);
	if (!found)
	{
		memset(wshared, 0, pgjq_wait_shmem_size());
		wshared->lock = &(GetNamedLWLockTranche("pgjq"))[2].lock;
		pg_atomic_init_u32(&wshared->nwaiting, 0);
		pg_atomic_init_u32(&wshared->njobwaiting, 0);
		wshared->nslots = slot_count();
	}
}

static Waiter *
my_waiter(void)
{
	int			procno = PGJQ_MY_PROCNO;

	if (procno < 0 || procno >= wshared->nslots)
		elog(ERROR, "pgjq: process slot %d out of range", procno);
	return &wshared->waiters[procno];
}

static void
on_exit_unregister(int code, Datum arg)
{
	pgjq_wait_unregister();
}

/*
 * Register this backend as waiting for any of the queues (of this database);
 * `await`: for await(), which takes no job itself.  Caller must call
 * pgjq_wait_unregister() on every exit path.
 */
void
pgjq_wait_register(int nqueues, const int32 *queue_ids, bool await)
{
	Waiter	   *w;

	if (nqueues > PGJQ_WAIT_MAX_QUEUES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a waiting claim can wait for at most %d queues", PGJQ_WAIT_MAX_QUEUES)));
	if (!exit_hook_set)
	{
		before_shmem_exit(on_exit_unregister, (Datum) 0);
		exit_hook_set = true;
	}
	w = my_waiter();
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->dboid = MyDatabaseId;
	w->nqueues = nqueues;
	memcpy(w->queue_ids, queue_ids, sizeof(int32) * nqueues);
	w->seq = wshared->next_seq++;
	w->waiting = true;
	w->await = await;
	w->woken = 0;
	leaving_ready = false;
	if (!registered)
		pg_atomic_fetch_add_u32(&wshared->nwaiting, 1);
	registered = true;
	LWLockRelease(wshared->lock);
}

/*
 * Sleep on the latch until `until` or a wake-up (or an interrupt, which
 * raises here), then wait again keeping our place in line: the caller checks
 * for jobs and calls this again or stops.
 */
void
pgjq_wait_sleep(TimestampTz until)
{
	sleep_until(until, PGJQ_WAIT_CLAIM);
	pgjq_wait_rearm();
}

/* After a wake-up that found nothing: wait again, keeping our place. */
void
pgjq_wait_rearm(void)
{
	Waiter	   *w = my_waiter();

	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->waiting = true;
	LWLockRelease(wshared->lock);
}

/*
 * Mark the longest-waiting backend of the queue (other than `self`, and only
 * a waiting claim when claims_only) woken and set its latch.  Returns false
 * when nobody waits for the queue.  Caller holds wait_lock exclusively.
 */
static bool
wake_one(Oid dboid, int32 queue_id, bool claims_only, const Waiter *self)
{
	Waiter	   *best = NULL;
	int			bestno = -1;
	int			bestq = -1;

	for (int i = 0; i < wshared->nslots; i++)
	{
		Waiter	   *w = &wshared->waiters[i];

		if (!w->waiting || w->dboid != dboid || w == self || (claims_only && w->await))
			continue;
		for (int q = 0; q < w->nqueues; q++)
			if (w->queue_ids[q] == queue_id)
			{
				if (best == NULL || w->seq < best->seq)
				{
					best = w;
					bestno = i;
					bestq = q;
				}
				break;
			}
	}
	if (best == NULL)
		return false;
	best->waiting = false;
	best->woken |= (uint32) 1 << bestq;
	SetLatch(&GetPGProcByNumber(bestno)->procLatch);
	return true;
}

/*
 * The queues whose wake-up this waiter holds (bit i: queue i as registered).
 * A claim reads it before an attempt and, after it, gives back with
 * pgjq_wait_used() the bits of the queues that the attempt looked at.
 */
uint32
pgjq_wait_woken(void)
{
	Waiter	   *w = my_waiter();
	uint32		woken;

	LWLockAcquire(wshared->lock, LW_SHARED);
	woken = w->woken;
	LWLockRelease(wshared->lock);
	return woken;
}

/* The wake-ups of these queues are used up (see pgjq_wait_woken). */
void
pgjq_wait_used(uint32 queues)
{
	Waiter	   *w = my_waiter();

	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->woken &= ~queues;
	LWLockRelease(wshared->lock);
}

/*
 * await() is about to return because a queue is ready: the caller will
 * claim, so a wake-up it holds goes on only to a waiting claim.
 */
void
pgjq_wait_leaving_ready(void)
{
	leaving_ready = true;
}

/*
 * Stop waiting.  Wake-ups this backend holds and did not use are handed on,
 * one each, to the next waiter of those queues: the jobs that caused them
 * may still be there.
 */
void
pgjq_wait_unregister(void)
{
	Waiter	   *w;

	if (!registered || wshared == NULL)
		return;
	w = my_waiter();
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->waiting = false;
	for (int q = 0; q < w->nqueues; q++)
		if (w->woken & ((uint32) 1 << q))
			(void) wake_one(w->dboid, w->queue_ids[q], w->await && leaving_ready, w);
	w->woken = 0;
	w->nqueues = 0;
	pg_atomic_fetch_sub_u32(&wshared->nwaiting, 1);
	registered = false;
	leaving_ready = false;
	LWLockRelease(wshared->lock);
}

/*
 * Wake up to n backends waiting for the queue (longest waiting first): mark
 * them woken and set their latches.  Call only after the change is visible.
 */
void
pgjq_wait_wake(Oid dboid, int32 queue_id, int n)
{
	if (wshared == NULL || n <= 0 || pg_atomic_read_u32(&wshared->nwaiting) == 0)
		return;
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	while (n-- > 0 && wake_one(dboid, queue_id, false, NULL))
		;
	LWLockRelease(wshared->lock);
}

/*
 * Wake for this transaction's commit notes (at_abort false) or for the
 * notes of claims whose (sub)transaction aborted (at_abort true), and forget
 * them.
 */
static void
wake_notes(bool at_abort)
{
	int			kept = 0;

	for (int i = 0; i < nnotes; i++)
	{
		if (notes[i].at_abort == at_abort && (!at_abort || notes[i].aborted))
			pgjq_wait_wake(MyDatabaseId, notes[i].queue_id, (int) Min(notes[i].n, PG_INT32_MAX));
		else
			notes[kept++] = notes[i];
	}
	nnotes = kept;
}

/*
 * The claims of level and deeper aborted: their notes wake waiters in the
 * resource-release callback, once the jobs are claimable again.
 */
static void
mark_aborted(int level)
{
	for (int i = 0; i < nnotes; i++)
		if (notes[i].at_abort && notes[i].level >= level)
		{
			notes[i].aborted = true;
			aborted = true;
		}
}

/* Forget this transaction's notes of one kind. */
static void
drop_notes(bool at_abort)
{
	int			kept = 0;

	for (int i = 0; i < nnotes; i++)
		if (notes[i].at_abort != at_abort)
			notes[kept++] = notes[i];
	nnotes = kept;
}

static void
wait_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (nnotes > 0)
				pgjq_crash_point("commit");
			/* the claims stand; the rest waits for wait_resource_callback */
			drop_notes(true);
			committed = true;
			break;
		case XACT_EVENT_PRE_PREPARE:

			{
				/*
				 * COMMIT PREPARED happens elsewhere: the wake-ups would be
				 * lost.  A claim that took nothing leaves a note of zero: no
				 * matter.
				 */
				bool		refuse = finished_any;

				for (int i = 0; i < nnotes; i++)
					refuse |= notes[i].n > 0;
				if (refuse)
					ereport(ERROR,
							(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
							 errmsg("cannot PREPARE a transaction that has enqueued, claimed or finished pgjq jobs"),
							 errdetail("pgjq wakes waiting claims and wait_jobs() callers at commit, which two-phase commit does not support.")));
			}
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			/* the claimed jobs are ready again after the ring's callback */
			drop_notes(false);
			mark_aborted(0);
			committed = false;
			finished_any = false;
			break;
		case XACT_EVENT_PREPARE:
			nnotes = 0;
			committed = false;
			aborted = false;
			finished_any = false;
			break;
		default:
			break;
	}
}

/*
 * The commit wake-ups, once the transaction's invalidation messages are
 * sent (after the commit callbacks): a claim woken by resume() or
 * alter_queue() must see the queue's new settings.  And the abort wake-ups
 * of a transaction or subtransaction, once every abort callback has run:
 * the ring's gives the claimed jobs back.  Called once per resource owner
 * of the tree; the first call of the phase does the work.
 */
static void
wait_resource_callback(ResourceReleasePhase phase, bool isCommit, bool isTopLevel, void *arg)
{
	if (phase != RESOURCE_RELEASE_AFTER_LOCKS)
		return;
	if (!isCommit && aborted)
	{
		aborted = false;
		wake_notes(true);
		if (isTopLevel)
			nnotes = 0;
		return;
	}
	if (!isTopLevel || !committed)
		return;
	committed = false;
	wake_notes(false);
	nnotes = 0;
	if (finished_any)
		wake_job_waiters();
}

static void
wait_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					  SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			/* woken in the resource-release callback, after the ring's */
			mark_aborted(level);
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (int i = 0; i < nnotes; i++)
				if (notes[i].at_abort && notes[i].level >= level)
					notes[i].level = level - 1;
			break;
		default:
			break;
	}
}

static void
register_callbacks(void)
{
	if (callback_registered)
		return;
	RegisterXactCallback(wait_xact_callback, NULL);
	RegisterSubXactCallback(wait_subxact_callback, NULL);
	RegisterResourceReleaseCallback(wait_resource_callback, NULL);
	callback_registered = true;
}

static void
add_note(int32 queue_id, bool at_abort, int64 n)
{
	int			level = at_abort ? GetCurrentTransactionNestLevel() : 0;

	if (wshared == NULL || n == 0)
		return;
	register_callbacks();
	for (int i = 0; i < nnotes; i++)
		if (notes[i].queue_id == queue_id && notes[i].at_abort == at_abort &&
			notes[i].level == level && !notes[i].aborted)
		{
			notes[i].n = Min(notes[i].n + n, PG_INT32_MAX);
			return;
		}
	if (n < 0)
		return;
	if (nnotes == maxnotes)
	{
		int			newmax = Max(8, maxnotes * 2);

		notes = notes ? repalloc(notes, sizeof(ReadyNote) * newmax) :
			MemoryContextAlloc(TopMemoryContext, sizeof(ReadyNote) * newmax);
		maxnotes = newmax;
	}
	notes[nnotes].queue_id = queue_id;
	notes[nnotes].at_abort = at_abort;
	notes[nnotes].aborted = false;
	notes[nnotes].level = level;
	notes[nnotes].n = n;
	nnotes++;
}

/*
 * Note that n jobs of the queue become claimable when this transaction
 * commits (n = PG_INT32_MAX: wake every waiter).  Kept even if a
 * subtransaction aborts: a spurious wake-up only costs a claim attempt.
 */
void
pgjq_wait_note_ready(int32 queue_id, int n)
{
	if (n > 0)
		add_note(queue_id, false, n);
}

/*
 * Note that a claim of the current subtransaction holds (n > 0) or no longer
 * holds (n < 0) n more jobs of the queue locked: if the subtransaction or
 * its transaction aborts, they are claimable again.
 */
void
pgjq_wait_note_claimed(int32 queue_id, int n)
{
	add_note(queue_id, true, n);
}

/* ---------------------------------------------------------------------
 * wait_jobs(): waiting for given jobs to finish
 *
 * A waiter publishes a 256-bit mask of its jobs' ids (hashed); a
 * transaction that finishes jobs (completes them, or ends them dead or
 * cancelled) collects their bits and, once its commit is visible, sets the
 * latch of every wait_jobs() caller of the database whose mask shares a bit.
 * A shared bit may be another job's (a spurious wake-up costs the waiter a
 * look at its jobs, nothing else).  With no wait_jobs() caller anywhere a
 * finishing commit reads one atomic counter and stops.
 * --------------------------------------------------------------------- */

static inline void
job_bit(uint64 *mask, int64 id)
{
	uint64		h = hash_bytes_uint32_extended((uint32) id, (uint64) (id >> 32));

	mask[(h >> 6) % JOBMASK_WORDS] |= UINT64CONST(1) << (h & 63);
}

/*
 * This transaction finishes job `id` (0: jobs it cannot name, such as those
 * of a dropped queue: every wait_jobs() caller looks again), ending it as
 * `how` (PGJQ_FINISHED_*; 0 with id 0).  Kept if a subtransaction aborts: a
 * spurious wake-up is harmless.
 */
void
pgjq_wait_note_finished(int64 id, char how)
{
	/* and for the jobs that wait on it (deps.c) */
	if (pgjq_wait_finished_hook)
		pgjq_wait_finished_hook(id, how);
	if (wshared == NULL)
		return;
	register_callbacks();
	if (!finished_any)
		memset(finished_mask, 0, sizeof(finished_mask));
	finished_any = true;
	if (id == 0)
		memset(finished_mask, 0xFF, sizeof(finished_mask));
	else
		job_bit(finished_mask, id);
}

static void
wake_job_waiters(void)
{
	finished_any = false;
	if (pg_atomic_read_u32(&wshared->njobwaiting) == 0)
		return;
	LWLockAcquire(wshared->lock, LW_SHARED);
	for (int i = 0; i < wshared->nslots; i++)
	{
		Waiter	   *w = &wshared->waiters[i];
		bool		hit = false;

		if (!w->jobs_waiting || w->dboid != MyDatabaseId)
			continue;
		for (int k = 0; k < JOBMASK_WORDS && !hit; k++)
			hit = (w->jobmask[k] & finished_mask[k]) != 0;
		if (hit)
			SetLatch(&GetPGProcByNumber(i)->procLatch);
	}
	LWLockRelease(wshared->lock);
}

static void
on_exit_jobs_unregister(int code, Datum arg)
{
	pgjq_wait_jobs_unregister();
}

/*
 * Register this backend as waiting for the jobs (before it first looks at
 * them, so that a commit in between sets its latch).  Caller must call
 * pgjq_wait_jobs_unregister() on every exit path.
 */
void
pgjq_wait_jobs_register(int n, const int64 *ids)
{
	static bool hook_set = false;
	uint64		mask[JOBMASK_WORDS] = {0};
	Waiter	   *w;

	if (!hook_set)
	{
		before_shmem_exit(on_exit_jobs_unregister, (Datum) 0);
		hook_set = true;
	}
	for (int i = 0; i < n; i++)
		job_bit(mask, ids[i]);
	w = my_waiter();
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->dboid = MyDatabaseId;
	memcpy(w->jobmask, mask, sizeof(mask));
	w->jobs_waiting = true;
	if (!jobs_registered)
		pg_atomic_fetch_add_u32(&wshared->njobwaiting, 1);
	jobs_registered = true;
	LWLockRelease(wshared->lock);
}

void
pgjq_wait_jobs_unregister(void)
{
	Waiter	   *w;

	if (!jobs_registered || wshared == NULL)
		return;
	w = my_waiter();
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->jobs_waiting = false;
	pg_atomic_fetch_sub_u32(&wshared->njobwaiting, 1);
	jobs_registered = false;
	LWLockRelease(wshared->lock);
}

/*
 * Sleep on the latch until `until`, a wake-up, or an interrupt (which
 * raises here).  wait_jobs() sleeps so; a waiting claim then re-arms.
 */
void
pgjq_wait_jobs_sleep(TimestampTz until)
{
	sleep_until(until, PGJQ_WAIT_JOBS);
}

/* the latch sleep of both, reported as `event` in pg_stat_activity */
static void
sleep_until(TimestampTz until, PgjqWaitEvent event)
{
	TimestampTz now = GetCurrentTimestamp();

	if (until > now)
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) ((until - now + 999) / 1000), pgjq_wait_event(event));
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
}
