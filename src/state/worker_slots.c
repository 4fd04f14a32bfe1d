/*-------------------------------------------------------------------------
 *
 * worker_slots.c
 *	  The worker slots in shared memory: each database's worker publishes
 *	  its latch and its planned wake-up there, so that a producer that
 *	  commits a job due before that wake-up sets the latch; the launcher
 *	  publishes its latch too.  (The shared memory of every module is
 *	  requested and attached by src/pgjq.c, this struct with the others.)
 *
 * Everything here is soft state: lost on restart and rebuilt as workers
 * attach.  Protocol (no lost wake-up, no polling):
 *
 *	 worker: ResetLatch; next_due := +infinity; do a pass and read the next
 *			 deadline from the tables; next_due := planned wake-up; WaitLatch.
 *	 producer, at commit: if its earliest new due time < next_due, SetLatch.
 *
 * While the worker is busy next_due is +infinity, so any commit during the
 * pass sets the latch and the worker looks again; after it publishes its
 * plan, only commits that need an earlier wake-up set it.  Due times noted:
 * a delayed enqueue's run_at, a snooze, a fail() retry (outcome.c), a new
 * lease end (claim.c) and a heartbeat's.  slots[] entries are assigned
 * under the lock; a producer reads its dboid, latch and next_due without
 * it (see wake_worker).  PREPARE TRANSACTION of a transaction with a pending
 * due time is refused (0A000): its commit would happen in another session,
 * waking no worker.
 *
 * The launcher publishes its latch too.  The commit of CREATE EXTENSION (its
 * script calls pgjq._require_preload()) sets it, with launcher_recheck, so
 * that a listed database the launcher found missing (created after its last
 * look) gets its worker now, not at its next look up to pgjq.max_sleep
 * later; and it wakes the database's worker, which may have found no
 * extension and be sleeping pgjq.max_sleep.  A reload wakes the launcher by
 * itself (SIGHUP).
 *
 *-------------------------------------------------------------------------
 */
#include "state/worker_slots.h"
#include "common/crash_points.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"

#define PGJQ_MAX_DATABASES 64

typedef struct PgjqWorkerSlot
{
	Oid			dboid;			/* InvalidOid when free */
	pid_t		pid;			/* the worker's process */
	Latch	   *latch;			/* the worker's process latch */
	pg_atomic_uint64 next_due;	/* TimestampTz of its planned wake-up */
	pg_atomic_uint64 pass_end;	/* TimestampTz its last pass ended, or 0 */
	pg_atomic_uint64 pass_us;	/* how long that pass took */
} PgjqWorkerSlot;

typedef struct PgjqSharedState
{
	LWLock	   *lock;			/* protects slot assignment */
	Latch	   *launcher_latch; /* the launcher's process latch, or NULL */
	pg_atomic_uint32 launcher_recheck;	/* look up missing databases now */
	PgjqWorkerSlot slots[PGJQ_MAX_DATABASES];
} PgjqSharedState;

static PgjqSharedState *pgjq_state = NULL;
static PgjqWorkerSlot *my_slot = NULL;

/* The earliest due time of jobs this transaction scheduled, or DT_NOEND. */
static TimestampTz pending_due = DT_NOEND;

/* This transaction created the extension: wake the launcher at commit. */
static bool pending_installed = false;
static bool xact_callback_registered = false;

static void register_xact_callback(void);

/* The worker slots' size: src/pgjq.c requests it with every module's. */
Size
pgjq_worker_slots_shmem_size(void)
{
	return MAXALIGN(sizeof(PgjqSharedState));
}

/*
 * Attach the worker slots (src/pgjq.c's shmem_startup_hook, holding
 * AddinShmemInitLock); true if they existed already.
 */
bool
pgjq_worker_slots_shmem_init(void)
{
	bool		found;

	pgjq_state = ShmemInitStruct("pgjq", pgjq_worker_slots_shmem_size(), &found);
	if (!found)
	{
		memset(pgjq_state, 0, sizeof(PgjqSharedState));
		pgjq_state->lock = &(GetNamedLWLockTranche("pgjq"))->lock;
		pg_atomic_init_u32(&pgjq_state->launcher_recheck, 0);
		for (int i = 0; i < PGJQ_MAX_DATABASES; i++)
		{
			pg_atomic_init_u64(&pgjq_state->slots[i].next_due, (uint64) DT_NOEND);
			pg_atomic_init_u64(&pgjq_state->slots[i].pass_end, 0);
			pg_atomic_init_u64(&pgjq_state->slots[i].pass_us, 0);
		}
	}
	return found;
}

PG_FUNCTION_INFO_V1(pgjq_require_preload);

/*
 * pgjq._require_preload(), called by the extension's install and upgrade
 * scripts: every queue's jobs live in shared memory as well as in tables
 * (the ring engine), so without the preload CREATE EXTENSION says so at
 * once rather than at the first enqueue.  With it, the launcher and this
 * database's worker are woken when the script's transaction commits (see
 * the file header); under ALTER EXTENSION UPDATE or a restore that is a
 * spurious wake-up, harmless.
 */
Datum
pgjq_require_preload(PG_FUNCTION_ARGS)
{
	if (pgjq_state == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq must be loaded through shared_preload_libraries"),
				 errhint("Add pgjq to shared_preload_libraries in postgresql.conf, restart the server, then run the command again.")));
	register_xact_callback();
	pending_installed = true;
	PG_RETURN_VOID();
}

/* True when pgjq was preloaded and its shared memory exists. */
bool
pgjq_shmem_ready(void)
{
	return pgjq_state != NULL;
}

/*
 * Set the latch of this database's worker if it plans to sleep past `due`.
 * Reads the slot without the lock: worker_detach may clear it meanwhile, so
 * the latch pointer is read exactly once (through a volatile pointer) and
 * tested before use.  A latch of a worker that just left is a PGPROC latch,
 * which stays valid shared memory: setting it is at worst a spurious wake-up.
 */
static void
wake_worker(TimestampTz due)
{
	for (int i = 0; i < PGJQ_MAX_DATABASES; i++)
	{
		volatile PgjqWorkerSlot *slot = &pgjq_state->slots[i];
		Latch	   *latch;

		if (slot->dboid != MyDatabaseId)
			continue;
		pg_read_barrier();
		latch = slot->latch;
		if (latch != NULL &&
			due < (TimestampTz) pg_atomic_read_u64(&pgjq_state->slots[i].next_due))
			SetLatch(latch);
		break;
	}
}

/*
 * The extension was created here: the launcher looks up the databases it
 * found missing (this one may be one of them) and this database's worker, if
 * one runs, looks for the extension again.  The launcher's latch is read
 * once, as in wake_worker; a stale one is a PGPROC latch (spurious wake-up).
 */
static void
wake_installed(void)
{
	volatile PgjqSharedState *state = pgjq_state;
	Latch	   *latch;

	/* the flag before the latch: the launcher resets its latch, then reads */
	pg_atomic_write_u32(&pgjq_state->launcher_recheck, 1);
	pg_memory_barrier();
	latch = state->launcher_latch;
	if (latch != NULL)
		SetLatch(latch);
	wake_worker(0);
}

/*
 * Wake this database's worker if it plans to sleep past `due`, now, outside
 * any transaction's commit: ring_xact.c's callbacks, once a claim the
 * worker passed over (being extended or closed) is open again.  Never
 * fails.  The worker itself reads the deadlines again after each pass.
 */
void
pgjq_shmem_wake_worker_at(TimestampTz due)
{
	if (pgjq_state != NULL && my_slot == NULL)
		wake_worker(due);
}

/* Wake this database's worker now (a dependency finished: deps.c). */
void
pgjq_shmem_wake_worker(void)
{
	if (pgjq_state == NULL)
		return;
	if (my_slot != NULL)
		SetLatch(MyLatch);		/* the worker's own commit: another pass */
	else
		wake_worker(0);
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (pending_due != DT_NOEND)
				pgjq_crash_point("commit");
			/* the worker itself reads the deadlines again after each pass */
			if (pending_due != DT_NOEND && pgjq_state && my_slot == NULL)
				wake_worker(pending_due);
			pending_due = DT_NOEND;
			if (pending_installed && pgjq_state)
				wake_installed();
			pending_installed = false;
			break;
		case XACT_EVENT_PRE_PREPARE:
			/* COMMIT PREPARED happens elsewhere: the worker would not wake */
			if (pending_due != DT_NOEND)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that has enqueued, claimed or finished pgjq jobs"),
						 errdetail("pgjq wakes its worker at commit, which two-phase commit does not support.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			pending_due = DT_NOEND;
			pending_installed = false;
			break;
		default:
			break;
	}
}

/*
 * Remember that this transaction made a job due at `due`; at commit the
 * database's worker is woken if it planned to sleep past it.  A no-op
 * without shared memory (the maintenance functions are then called by hand).
 */
void
pgjq_shmem_note_due(TimestampTz due)
{
	if (pgjq_state == NULL)
		return;
	register_xact_callback();
	if (due < pending_due)
		pending_due = due;
}

static void
register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(xact_callback, NULL);
		xact_callback_registered = true;
	}
}

static void
launcher_detach(int code, Datum arg)
{
	LWLockAcquire(pgjq_state->lock, LW_EXCLUSIVE);
	pgjq_state->launcher_latch = NULL;
	LWLockRelease(pgjq_state->lock);
}

/* The launcher publishes its latch (see wake_installed). */
void
pgjq_shmem_launcher_attach(void)
{
	LWLockAcquire(pgjq_state->lock, LW_EXCLUSIVE);
	pgjq_state->launcher_latch = &MyProc->procLatch;
	LWLockRelease(pgjq_state->lock);
	before_shmem_exit(launcher_detach, (Datum) 0);
}

/*
 * Whether an extension was created since the launcher last asked: it then
 * looks up the databases it found missing at once.  Call after ResetLatch.
 */
bool
pgjq_shmem_launcher_recheck(void)
{
	return pg_atomic_exchange_u32(&pgjq_state->launcher_recheck, 0) != 0;
}

static void
worker_detach(int code, Datum arg)
{
	if (my_slot == NULL)
		return;
	LWLockAcquire(pgjq_state->lock, LW_EXCLUSIVE);
	my_slot->latch = NULL;
	my_slot->pid = 0;
	my_slot->dboid = InvalidOid;
	pg_atomic_write_u64(&my_slot->next_due, (uint64) DT_NOEND);
	pg_atomic_write_u64(&my_slot->pass_end, 0);
	pg_atomic_write_u64(&my_slot->pass_us, 0);
	LWLockRelease(pgjq_state->lock);
	my_slot = NULL;
}

/*
 * Take this database's slot for the calling worker.  Errors if another
 * worker already serves the database or no slot is free.
 */
void
pgjq_shmem_worker_attach(Oid dboid)
{
	PgjqWorkerSlot *free_slot = NULL;

	LWLockAcquire(pgjq_state->lock, LW_EXCLUSIVE);
	for (int i = 0; i < PGJQ_MAX_DATABASES; i++)
	{
		PgjqWorkerSlot *slot = &pgjq_state->slots[i];

		if (slot->dboid == dboid)
		{
			LWLockRelease(pgjq_state->lock);
			ereport(ERROR,
					(errcode(ERRCODE_DUPLICATE_OBJECT),
					 errmsg("a pgjq worker already serves this database"),
					 errdetail("Its process ID is %d.", (int) slot->pid)));
		}
		if (slot->dboid == InvalidOid && free_slot == NULL)
			free_slot = slot;
	}
	if (free_slot == NULL)
	{
		LWLockRelease(pgjq_state->lock);
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("pgjq serves at most %d databases", PGJQ_MAX_DATABASES)));
	}
	free_slot->dboid = dboid;
	free_slot->pid = MyProcPid;
	free_slot->latch = &MyProc->procLatch;
	pg_atomic_write_u64(&free_slot->next_due, (uint64) DT_NOEND);
	pg_atomic_write_u64(&free_slot->pass_end, 0);
	pg_atomic_write_u64(&free_slot->pass_us, 0);
	my_slot = free_slot;
	LWLockRelease(pgjq_state->lock);
	before_shmem_exit(worker_detach, (Datum) 0);
}

/*
 * Stop the database workers a previous launcher left behind (a launcher that
 * was restarted no longer has their handles): send each SIGTERM and wait up
 * to ten seconds for its slot to free.  Called by the launcher at start.
 */
void
pgjq_shmem_stop_stray_workers(void)
{
	for (int tries = 0; tries < 1000; tries++)
	{
		bool		any = false;

		LWLockAcquire(pgjq_state->lock, LW_SHARED);
		for (int i = 0; i < PGJQ_MAX_DATABASES; i++)
		{
			PgjqWorkerSlot *slot = &pgjq_state->slots[i];

			if (slot->dboid != InvalidOid && slot->pid != 0)
			{
				any = true;
				if (tries == 0)
					(void) kill(slot->pid, SIGTERM);
			}
		}
		LWLockRelease(pgjq_state->lock);
		if (!any)
			return;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(10000L);
	}
	ereport(WARNING,
			(errmsg("pgjq launcher: workers of a previous launcher did not stop")));
}

/*
 * The worker publishes when it plans to wake (DT_NOEND while busy); see the
 * protocol in the file header.
 */
void
pgjq_shmem_worker_plan(TimestampTz wake_at)
{
	pg_atomic_write_u64(&my_slot->next_due, (uint64) wake_at);
	pg_write_barrier();
}

/*
 * The worker records when its pass ended and how long it took, for the
 * metrics (pgjq_worker_last_pass_*).  Atomics: readers take no lock.
 */
void
pgjq_shmem_worker_pass_done(TimestampTz start, TimestampTz end)
{
	pg_atomic_write_u64(&my_slot->pass_us, (uint64) Max(0, end - start));
	pg_atomic_write_u64(&my_slot->pass_end, (uint64) end);
}

/*
 * The last pass of each database's worker that has finished one, with the
 * database's name, allocated in the current context (the caller is in a
 * transaction: names come from the catalog).  Returns how many.
 */
int
pgjq_shmem_worker_passes(PgjqWorkerPass **passes)
{
	Oid			dboids[PGJQ_MAX_DATABASES];
	TimestampTz ends[PGJQ_MAX_DATABASES];
	int64		durations[PGJQ_MAX_DATABASES];
	int			n = 0;
	int			k = 0;

	*passes = palloc0(sizeof(PgjqWorkerPass) * PGJQ_MAX_DATABASES);
	if (pgjq_state == NULL)
		return 0;
	LWLockAcquire(pgjq_state->lock, LW_SHARED);
	for (int i = 0; i < PGJQ_MAX_DATABASES; i++)
	{
		PgjqWorkerSlot *slot = &pgjq_state->slots[i];
		uint64		end = pg_atomic_read_u64(&slot->pass_end);

		if (slot->dboid == InvalidOid || end == 0)
			continue;
		dboids[n] = slot->dboid;
		ends[n] = (TimestampTz) end;
		durations[n] = (int64) pg_atomic_read_u64(&slot->pass_us);
		n++;
	}
	LWLockRelease(pgjq_state->lock);
	for (int i = 0; i < n; i++)
	{
		char	   *name = get_database_name(dboids[i]);

		if (name == NULL)
			continue;			/* dropped meanwhile */
		(*passes)[k].dbname = name;
		(*passes)[k].end = ends[i];
		(*passes)[k].duration_us = durations[i];
		k++;
	}
	return k;
}
