/*-------------------------------------------------------------------------
 *
 * wait.c
 *	  Waiting claims: backends sleep on their latch until a job of one of
 *	  their queues becomes claimable; producers wake them at commit.
 *
 * Shared state is one record per PGPROC slot: the queues the backend waits
 * for, whether it is waiting, and its arrival order.  A transaction that
 * makes n jobs of a queue claimable (enqueue, promote, retry_dead, resume,
 * or a finished job freeing capacity under a concurrency limit) notes it;
 * when it commits, the n longest-waiting backends of that queue are marked
 * woken and their latches set.  So the wake-up never precedes visibility,
 * rolled-back work wakes no one, and n jobs wake about n waiters, not all.
 *
 * A waiter registers before its first claim attempt, so a commit that its
 * attempt's snapshot missed still finds it registered and sets its latch.
 * A woken waiter claims again; if another claimer got there first it re-arms
 * and sleeps for the rest of its wait.  No NOTIFY, no polling.
 *
 * PREPARE TRANSACTION of a transaction with notes is refused (0A000): the
 * wake-ups would have to happen at a COMMIT PREPARED in another session.
 *
 * Locking: wait_lock guards the records; nwaiting lets producers skip it
 * when nobody waits.  Callers must not hold limits.c's lock.
 *
 *-------------------------------------------------------------------------
 */
#include "limits.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#if PG_VERSION_NUM >= 170000
#define MY_PROCNO	MyProcNumber
#else
#define MY_PROCNO	(MyProc->pgprocno)
#endif

typedef struct Waiter
{
	Oid			dboid;
	bool		waiting;
	int			nqueues;
	uint64		seq;
	int32		queue_ids[PGJQ_WAIT_MAX_QUEUES];
} Waiter;

typedef struct WaitShared
{
	LWLock	   *lock;
	pg_atomic_uint32 nwaiting;
	uint64		next_seq;
	int			nslots;
	Waiter		waiters[FLEXIBLE_ARRAY_MEMBER];
} WaitShared;

static WaitShared *wshared = NULL;
static bool registered = false;
static bool exit_hook_set = false;

/* Queues this transaction made claimable, to wake at commit. */
typedef struct ReadyNote
{
	int32		queue_id;
	int			n;
} ReadyNote;

static ReadyNote *notes = NULL;
static int	nnotes = 0;
static int	maxnotes = 0;
static bool callback_registered = false;

static PgjqBecameReadyHook prev_became_ready_hook = NULL;

static int
slot_count(void)
{
	/* every PGPROC: backends, auxiliary processes, prepared transactions */
#if PG_VERSION_NUM >= 150000
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
#else
	return MaxConnections + autovacuum_max_workers + 1 + max_worker_processes +
		max_wal_senders + NUM_AUXILIARY_PROCS + max_prepared_xacts;
#endif
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
		wshared->nslots = slot_count();
	}
}

static void
became_ready(int32 queue_id, int n)
{
	if (prev_became_ready_hook)
		prev_became_ready_hook(queue_id, n);
	pgjq_wait_note_ready(queue_id, n);
}

void
pgjq_wait_startup(void)
{
	prev_became_ready_hook = pgjq_became_ready_hook;
	pgjq_became_ready_hook = became_ready;
}

static Waiter *
my_waiter(void)
{
	int			procno = MY_PROCNO;

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
 * Register this backend as waiting for any of the queues (of this database).
 * Caller must call pgjq_wait_unregister() on every exit path.
 */
void
pgjq_wait_register(int nqueues, const int32 *queue_ids)
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
	TimestampTz now = GetCurrentTimestamp();

	if (until > now)
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) ((until - now + 999) / 1000), PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
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

void
pgjq_wait_unregister(void)
{
	Waiter	   *w;

	if (!registered || wshared == NULL)
		return;
	w = my_waiter();
	LWLockAcquire(wshared->lock, LW_EXCLUSIVE);
	w->waiting = false;
	w->nqueues = 0;
	pg_atomic_fetch_sub_u32(&wshared->nwaiting, 1);
	registered = false;
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
	while (n-- > 0)
	{
		Waiter	   *best = NULL;
		int			bestno = -1;

		for (int i = 0; i < wshared->nslots; i++)
		{
			Waiter	   *w = &wshared->waiters[i];

			if (!w->waiting || w->dboid != dboid)
				continue;
			for (int q = 0; q < w->nqueues; q++)
				if (w->queue_ids[q] == queue_id)
				{
					if (best == NULL || w->seq < best->seq)
					{
						best = w;
						bestno = i;
					}
					break;
				}
		}
		if (best == NULL)
			break;
		best->waiting = false;
		SetLatch(&GetPGProcByNumber(bestno)->procLatch);
	}
	LWLockRelease(wshared->lock);
}

static void
wait_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			for (int i = 0; i < nnotes; i++)
				pgjq_wait_wake(MyDatabaseId, notes[i].queue_id, notes[i].n);
			nnotes = 0;
			break;
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT PREPARED happens elsewhere: the wake-ups would be lost */
			if (nnotes > 0)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has made pgjq jobs ready"),
						 errdetail("pgjq wakes waiting claims at commit, which two-phase commit does not support.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			nnotes = 0;
			break;
		default:
			break;
	}
}

/*
 * Note that n jobs of the queue become claimable when this transaction
 * commits (n = INT_MAX: wake every waiter).  Kept even if a subtransaction
 * aborts: a spurious wake-up only costs a claim attempt.
 */
void
pgjq_wait_note_ready(int32 queue_id, int n)
{
	if (wshared == NULL || n <= 0)
		return;
	if (!callback_registered)
	{
		RegisterXactCallback(wait_xact_callback, NULL);
		callback_registered = true;
	}
	for (int i = 0; i < nnotes; i++)
		if (notes[i].queue_id == queue_id)
		{
			notes[i].n = (n > PG_INT32_MAX - notes[i].n) ? PG_INT32_MAX : notes[i].n + n;
			return;
		}
	if (nnotes == maxnotes)
	{
		int			newmax = Max(8, maxnotes * 2);

		notes = notes ? repalloc(notes, sizeof(ReadyNote) * newmax) :
			MemoryContextAlloc(TopMemoryContext, sizeof(ReadyNote) * newmax);
		maxnotes = newmax;
	}
	notes[nnotes].queue_id = queue_id;
	notes[nnotes].n = n;
	nnotes++;
}
