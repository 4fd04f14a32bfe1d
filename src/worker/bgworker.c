/*-------------------------------------------------------------------------
 *
 * bgworker.c
 *	  The pgjq launcher and its per-database workers: scheduling only; the
 *	  work itself is maintenance.c.
 *
 * The launcher (a static worker registered by _PG_init, no database
 * connection) reads pgjq.database_names and keeps one dynamic worker per
 * listed database: it starts missing ones, stops ones no longer listed, and
 * restarts a worker that died (at most every RESTART_DELAY).  A listed
 * database that is not in pg_database (a shared catalog it can read) gets
 * no worker; that is logged once and looked up again every pgjq.max_sleep.
 * The launcher is woken by the postmaster whenever one of its workers
 * starts or stops (bgw_notify_pid), by SIGHUP, and by the commit of CREATE
 * EXTENSION pgjq (shmem.c): it then looks up the databases it found missing
 * at once, so a database created after the server started gets its worker
 * within moments, not at the next look.
 *
 * A database worker loops: rescue expired leases, promote due jobs, prune
 * history every pgjq.prune_interval; then sleeps until the next deadline
 * read from the tables (next due job, next lease expiry, next prune), at
 * most pgjq.max_sleep.  A commit that brings a deadline forward wakes it
 * through its latch (shmem.c).  A database without the extension is checked
 * again after pgjq.max_sleep.
 *
 * Every step runs in its own short transaction: rescue and promote one
 * chunk of PGJQ_MAINTENANCE_CHUNK jobs at a time, prune one partition at a
 * time (it locks the history parents), with caps per pass so that one step
 * cannot starve the others.  A step that fails is reported and aborted
 * (run_step's PG_TRY), and the pass goes on; a deadline left overdue by a
 * failure or by rows locked by clients makes the worker back off rather
 * than spin (worker_pass).
 *
 * DDL on the extension goes first: each step's transaction takes a share
 * lock on the extension itself before it touches any of pgjq's relations,
 * and steps aside (skips the step, quietly) when it cannot have it at once.
 * DROP EXTENSION locks the extension before any member (so it waits for the
 * step in progress, never the other way round), and ALTER EXTENSION pgjq
 * UPDATE's scripts begin with pgjq._exclude_worker(), which takes the same
 * lock exclusively.  Without that one lock order, a step holding one of
 * pgjq's tables and waiting for another deadlocked with a DROP that held the
 * second and waited for the first (issue 35, finding 6).
 *
 * SIGTERM of a database worker (server shutdown, pg_terminate_backend, a new
 * launcher) cancels the step in progress, if any, and the worker exits
 * cleanly (code 0).  The launcher dies on SIGTERM (code 1), so the
 * postmaster starts it again.  Both start only once recovery has finished,
 * so on a hot standby nothing runs; after promotion the postmaster starts
 * the launcher.  After a crash the postmaster restarts the launcher, which
 * starts the workers again.
 *
 *-------------------------------------------------------------------------
 */
#include "worker/bgworker.h"
#include "common/pgjq_common.h"
#include "state/limits.h"
#include "worker/horizon.h"
#include "api/maintenance.h"
#include "api/schedule.h"
#include "common/crash_points.h"
#include "common/guc.h"
#include "common/wait_events.h"
#include "engine/engine.h"
#include "state/worker_slots.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "storage/lmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#define RESTART_DELAY_MS	5000
#define MIN_SLEEP_MS		20
#define IDLE_BACKOFF_MS		1000
#define MAX_WORKERS			64
#define MAX_CHUNKS_PER_PASS	100
#define PRUNE_MAX_PER_PASS	16

typedef struct LauncherEntry
{
	char		dbname[NAMEDATALEN];
	BackgroundWorkerHandle *handle;
	TimestampTz started_at;
	bool		wanted;
	bool		missing;		/* not in pg_database (logged once) */
	TimestampTz checked_at;		/* when pg_database was last read for it */
} LauncherEntry;

static LauncherEntry entries[MAX_WORKERS];
static int	nentries = 0;

void
pgjq_bgworker_init(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));

	/*
	 * a "connection" to no database: it shows in pg_stat_activity and gets
	 * SIGUSR1
	 */
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pgjq");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pgjq_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pgjq launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "pgjq launcher");
	RegisterBackgroundWorker(&worker);
}

static void
start_worker(LauncherEntry *e)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "pgjq");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "pgjq_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "pgjq worker for database %s", e->dbname);
	snprintf(worker.bgw_type, BGW_MAXLEN, "pgjq worker");
	strlcpy(worker.bgw_extra, e->dbname, BGW_EXTRALEN);
	worker.bgw_notify_pid = MyProcPid;

	e->started_at = GetCurrentTimestamp();
	if (!RegisterDynamicBackgroundWorker(&worker, &e->handle))
	{
		e->handle = NULL;
		ereport(WARNING,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("pgjq could not start a worker for database \"%s\"", e->dbname),
				 errhint("Raise max_worker_processes.")));
	}
}

/* Mark entries wanted per pgjq.database_names, adding new ones. */
static void
read_database_names(void)
{
	char	   *raw = pstrdup(pgjq_database_names ? pgjq_database_names : "");
	List	   *names = NIL;
	ListCell   *lc;

	for (int i = 0; i < nentries; i++)
		entries[i].wanted = false;
	if (!SplitGUCList(raw, ',', &names))
	{
		ereport(LOG,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("pgjq.database_names is not a valid list: \"%s\"", pgjq_database_names)));
		return;
	}
	foreach(lc, names)
	{
		char	   *name = (char *) lfirst(lc);
		int			i;

		if (name[0] == '\0')
			continue;
		for (i = 0; i < nentries; i++)
			if (strcmp(entries[i].dbname, name) == 0)
				break;
		if (i == nentries)
		{
			if (nentries == MAX_WORKERS)
			{
				ereport(LOG,
						(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
						 errmsg("pgjq serves at most %d databases; \"%s\" is ignored",
								MAX_WORKERS, name)));
				continue;
			}
			memset(&entries[i], 0, sizeof(LauncherEntry));
			strlcpy(entries[i].dbname, name, NAMEDATALEN);
			nentries++;
		}
		entries[i].wanted = true;
	}
}

/*
 * True when database `name` exists and accepts connections.  pg_database is
 * a shared catalog, which the launcher can read without a database
 * connection.
 */
static bool
database_exists(const char *name)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		found = false;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (strcmp(NameStr(db->datname), name) == 0)
		{
			found = db->datallowconn;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();
	return found;
}

/*
 * Reconcile the running workers with the wanted ones; returns how long the
 * launcher may sleep before a worker that died may be restarted.
 *
 * A listed database that does not exist (or does not allow connections)
 * gets no worker: that would only fail at connection, over and over.  It is
 * logged once and looked up again every pgjq.max_sleep.
 */
static long
reconcile(void)
{
	TimestampTz now = GetCurrentTimestamp();
	long		sleep_ms = 60000;

	for (int i = 0; i < nentries; i++)
	{
		LauncherEntry *e = &entries[i];
		pid_t		pid;
		bool		running = e->handle != NULL &&
		GetBackgroundWorkerPid(e->handle, &pid) != BGWH_STOPPED;

		if (!e->wanted)
		{
			if (running)
				TerminateBackgroundWorker(e->handle);
			else
			{
				/* forget it: move the last entry here */
				if (e->handle)
					pfree(e->handle);
				entries[i] = entries[--nentries];
				i--;
			}
			continue;
		}
		if (running)
			continue;
		if (e->missing &&
			!TimestampDifferenceExceeds(e->checked_at, now, pgjq_max_sleep_ms))
		{
			long		wait = pgjq_max_sleep_ms -
			(long) ((now - e->checked_at) / 1000);

			sleep_ms = Min(sleep_ms, Max(wait, 10));
			continue;
		}
		if (e->handle == NULL || TimestampDifferenceExceeds(e->started_at, now, RESTART_DELAY_MS))
		{
			if (e->handle)
				pfree(e->handle);
			e->handle = NULL;
			e->checked_at = now;
			if (!database_exists(e->dbname))
			{
				if (!e->missing)
					ereport(LOG,
							(errcode(ERRCODE_UNDEFINED_DATABASE),
							 errmsg("pgjq: database \"%s\" listed in pgjq.database_names does not exist or does not allow connections",
									e->dbname),
							 errdetail("No worker is started for it; it is looked up again every pgjq.max_sleep.")));
				e->missing = true;
				sleep_ms = Min(sleep_ms, Max(pgjq_max_sleep_ms, 10));
				continue;
			}
			e->missing = false;
			start_worker(e);
		}
		else
		{
			long		wait = RESTART_DELAY_MS -
			(long) ((now - e->started_at) / 1000);

			sleep_ms = Min(sleep_ms, Max(wait, 10));
		}
	}
	return sleep_ms;
}

void
pgjq_launcher_main(Datum main_arg)
{
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* exit code 1 on SIGTERM: the postmaster restarts a terminated launcher */
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("pgjq launcher");

	/* a restarted launcher starts its workers afresh */
	pgjq_shmem_stop_stray_workers();
	pgjq_shmem_launcher_attach();
	read_database_names();
	for (;;)
	{
		long		sleep_ms;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			read_database_names();
		}
		/* an extension was created: it may be in a database found missing */
		if (pgjq_shmem_launcher_recheck())
			for (int i = 0; i < nentries; i++)
				if (entries[i].missing)
					entries[i].checked_at = 0;
		sleep_ms = reconcile();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, pgjq_wait_event(PGJQ_WAIT_LAUNCHER));
		ResetLatch(MyLatch);
	}
}

/*
 * The database worker.
 *
 * SIGTERM sets ShutdownRequestPending and, while a step runs, also cancels
 * its statement (the step may wait for a lock or work through a backlog):
 * the step's error is caught, and the loop then leaves with code 0.  So a
 * terminated worker stops within a statement's cancellation, and a clean
 * exit is not taken by the launcher or the postmaster for a failure.
 */
static volatile sig_atomic_t in_step = false;

static void
worker_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	ShutdownRequestPending = true;
	if (in_step)
	{
		QueryCancelPending = true;
		InterruptPending = true;
	}
	SetLatch(MyLatch);
	errno = save_errno;
}

/* Name the failing step in the log (errcontext). */
static void
step_error_context(void *arg)
{
	errcontext("pgjq worker step \"%s\"", (const char *) arg);
}

/*
 * The step's share of the extension lock (see the file header).  False when
 * DDL on the extension holds or awaits it, or the extension went away or was
 * made again while we looked: the step steps aside.  No extension: nothing
 * to lock (extension_present() says so itself).
 */
static bool
lock_extension_for_step(void)
{
	Oid			ext = get_extension_oid("pgjq", true);

	if (!OidIsValid(ext))
		return true;
	if (!ConditionalLockDatabaseObject(ExtensionRelationId, ext, 0, AccessShareLock))
		return false;
	/* the lock processed invalidations: is it still the same extension? */
	return get_extension_oid("pgjq", true) == ext;
}

/*
 * Run one maintenance step in its own transaction.  An error is reported
 * (unless the worker is being shut down) and the transaction aborted; the
 * worker goes on with its next step.  Returns false when the step failed
 * or did not run (a shutdown request, or DDL on the extension that it
 * stepped aside for); *result gets its value.
 */
static bool
run_step(const char *what, int64 (*step) (void), int64 *result)
{
	MemoryContext cxt = CurrentMemoryContext;
	ErrorContextCallback errcb;
	volatile bool ok = true;
	volatile int64 n = 0;

	in_step = true;
	if (ShutdownRequestPending)
	{
		in_step = false;
		return false;
	}
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PG_TRY();
	{
		/* PG_CATCH restores error_context_stack */
		errcb.callback = step_error_context;
		errcb.arg = (void *) what;
		errcb.previous = error_context_stack;
		error_context_stack = &errcb;
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, what);
		if (lock_extension_for_step())
		{
			n = step();
			if (pgjq_debug_worker_step_ms > 0)
				pg_usleep((long) pgjq_debug_worker_step_ms * 1000L);
		}
		else
		{
			elog(DEBUG1, "pgjq: %s: steps aside for DDL on the extension", what);
			ok = false;
		}
		PopActiveSnapshot();
		CommitTransactionCommand();
		error_context_stack = errcb.previous;
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		MemoryContextSwitchTo(cxt);
		if (!ShutdownRequestPending)
			EmitErrorReport();
		FlushErrorState();
		AbortOutOfAnyTransaction();
		RESUME_INTERRUPTS();
		ok = false;
	}
	PG_END_TRY();
	in_step = false;
	pgstat_report_activity(STATE_IDLE, NULL);
	if (ok && n > 0)
		elog(DEBUG1, "pgjq: %s: " INT64_FORMAT, what, (int64) n);
	*result = n;
	return ok;
}

/* Count the running jobs into shared memory if not done yet (limits.c). */
static int64
rebuild_counters(void)
{
	pgjq_limits_rebuild_if_needed();
	return 0;
}

/*
 * 1 when the pgjq extension exists in this database at a version this
 * library serves (a 0.1.0 schema waits for ALTER EXTENSION UPDATE).
 */
static int64
extension_present(void)
{
	return OidIsValid(get_extension_oid("pgjq", true)) && pgjq_storage_schema_current() ? 1 : 0;
}

static int64
next_deadline(void)
{
	return (int64) pgjq_maintenance_next_deadline();
}

static int64
prune_prepare(void)
{
	pgjq_maintenance_prune_prepare();
	return 0;
}

/* The partition prune_one() works on, and its outcome. */
static int	prune_skip;
static int	prune_result;

static int64
prune_one(void)
{
	int64		pruned = 0;

	prune_result = pgjq_maintenance_prune_one(prune_skip, &pruned);
	return pruned;
}

/*
 * Prune, one partition per transaction, at most PRUNE_MAX_PER_PASS per pass
 * (the other steps must not wait behind a long backlog).  Returns false if
 * a step failed; *more is set when partitions are left for the next pass.
 */
static bool
prune(bool *more)
{
	int64		n;
	int			removed = 0;

	*more = false;
	if (!run_step("pgjq: prune", prune_prepare, &n))
		return false;
	prune_skip = 0;
	for (;;)
	{
		if (!run_step("pgjq: prune", prune_one, &n))
			return false;
		if (prune_result < 0)
			return true;
		if (prune_result == 0)
			prune_skip++;		/* busy: the next pass tries it again */
		else if (++removed == PRUNE_MAX_PER_PASS)
		{
			*more = true;
			return true;
		}
	}
}

/*
 * Rescue or promote, one chunk per transaction, at most MAX_CHUNKS_PER_PASS
 * chunks.  Returns false if a chunk failed; *progress is set when a chunk
 * did something and *more when the cap left work for the next pass.
 */
static bool
run_chunks(const char *what, int64 (*step) (void), bool *progress, bool *more)
{
	int64		n;

	for (int c = 0; c < MAX_CHUNKS_PER_PASS; c++)
	{
		if (!run_step(what, step, &n))
			return false;
		if (n > 0)
		{
			*progress = true;
			pgjq_crash_point("worker_chunk");
		}
		if (n < PGJQ_MAINTENANCE_CHUNK)
			return true;
	}
	*more = true;
	return true;
}

/*
 * Give the ring's space back, one step per transaction (a truncation, or up
 * to PGJQ_MAINTENANCE_CHUNK jobs relocated), at most MAX_CHUNKS_PER_PASS.
 */
static bool
ring_reclaim(bool *progress, bool *more)
{
	int64		n;

	for (int c = 0; c < MAX_CHUNKS_PER_PASS; c++)
	{
		if (!run_step("pgjq: ring space", pgjq_maintenance_ring_reclaim_chunk, &n))
			return false;
		if (n == 0)
			return true;
		*progress = true;
		pgjq_crash_point("worker_reclaim");
	}
	*more = true;
	return true;
}

typedef struct WorkerState
{
	TimestampTz last_prune;		/* when the last prune started (0: never) */
	bool		prune_more;		/* it left expired partitions behind */
	long		backoff_ms;		/* current sleep while a deadline is overdue */
} WorkerState;

/*
 * One pass over the steps; returns how long to sleep (ms).
 *
 * The sleep lasts until the earliest deadline (next due job, next lease end,
 * next prune), at most pgjq.max_sleep.  A deadline already past after the
 * pass means work the pass could not do: a row locked by a client (rescue
 * and promote skip locked rows), or a failed step.  Looking again at once
 * would spin, so the sleep then backs off exponentially from MIN_SLEEP_MS,
 * up to IDLE_BACKOFF_MS (a client's lock is usually short, and nobody wakes
 * the worker when it ends) or, after a failure, up to pgjq.max_sleep.  A
 * pass that did something, or left work because of the caps, looks again
 * at once.
 */
static long
worker_pass(WorkerState *ws)
{
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz wake = now + (int64) pgjq_max_sleep_ms * 1000;
	bool		failed = false;
	bool		progress = false;
	bool		more = false;
	bool		known = true;
	int64		n;
	long		cap;
	TimestampTz next_prune;

	if (!run_step("pgjq: checking for the extension", extension_present, &n))
		failed = true;
	else if (n == 1)
	{
		/*
		 * waiting jobs whose dependencies finished, released or cancelled
		 * (deps.c): first, as a completion woke the worker for them
		 */
		if (!run_chunks("pgjq: dependencies", pgjq_deps_resolve_chunk, &progress, &more))
			failed = true;
		/* rescue first: a rescued job that is due at once is then promoted */
		if (!run_step("pgjq: counters", rebuild_counters, &n))
			failed = true;
		if (!run_chunks("pgjq: rescue", pgjq_maintenance_rescue_chunk, &progress, &more))
			failed = true;
		if (!run_chunks("pgjq: promote", pgjq_maintenance_promote_chunk, &progress, &more))
			failed = true;
		/* periodic jobs: each due slot enqueued once (schedule.c) */
		if (!run_chunks("pgjq: schedules", pgjq_schedule_fire_chunk, &progress, &more))
			failed = true;
		/* the ring's space: a truncation or a chunk of relocated jobs each */
		if (!ring_reclaim(&progress, &more))
			failed = true;
		/* job(id) reads only the filling range of job_done's index */
		if (!run_step("pgjq: history summaries", pgjq_maintenance_summarize, &n))
			failed = true;
		/* the horizon guard's failure is reported and delays no other work */
		(void) run_step("pgjq: horizon", pgjq_horizon_check, &n);
		/* from the last prune: a new pgjq.prune_interval applies at once */
		next_prune = ws->last_prune + (int64) pgjq_prune_interval_ms * 1000;
		if ((now >= next_prune || ws->prune_more) && !ShutdownRequestPending)
		{
			/* a failed prune is tried again after the interval */
			ws->last_prune = now;
			next_prune = now + (int64) pgjq_prune_interval_ms * 1000;
			if (!prune(&ws->prune_more))
			{
				failed = true;
				ws->prune_more = false;
			}
			more = more || ws->prune_more;
		}
		wake = Min(wake, next_prune);
		if (run_step("pgjq: next deadline", next_deadline, &n))
			wake = Min(wake, (TimestampTz) n);
		else
		{
			failed = true;
			known = false;
		}
	}
	if (ShutdownRequestPending)
		return 0;

	now = GetCurrentTimestamp();
	if (more)
	{
		ws->backoff_ms = 0;
		return 0;
	}
	if (known && wake > now)
	{
		ws->backoff_ms = 0;
		return Max(MIN_SLEEP_MS, (long) ((wake - now + 999) / 1000));
	}
	cap = failed ? pgjq_max_sleep_ms : Min(IDLE_BACKOFF_MS, pgjq_max_sleep_ms);
	if (progress && !failed)
		ws->backoff_ms = MIN_SLEEP_MS;
	else if (ws->backoff_ms == 0)
		ws->backoff_ms = failed ? 1000 : MIN_SLEEP_MS;
	else
		ws->backoff_ms = ws->backoff_ms * 2;
	ws->backoff_ms = Max(MIN_SLEEP_MS, Min(ws->backoff_ms, cap));
	return ws->backoff_ms;
}

/*
 * Process pending interrupts between passes (a procsignal barrier must not
 * wait for a worker's whole sleep).  A cancel request arriving here raises
 * an error outside any step: report it rather than let it end the worker.
 */
static void
check_interrupts(void)
{
	if (!InterruptPending)
		return;
	PG_TRY();
	{
		CHECK_FOR_INTERRUPTS();
	}
	PG_CATCH();
	{
		HOLD_INTERRUPTS();
		EmitErrorReport();
		FlushErrorState();
		RESUME_INTERRUPTS();
	}
	PG_END_TRY();
}

void
pgjq_worker_main(Datum main_arg)
{
	char		dbname[NAMEDATALEN];
	WorkerState ws = {0, false, 0};

	strlcpy(dbname, MyBgworkerEntry->bgw_extra, NAMEDATALEN);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, worker_sigterm);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(dbname, NULL, 0);
	pgstat_report_appname("pgjq worker");

	/* plans are parsed under this path only (see spi_plans.c) */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	pgjq_shmem_worker_attach(MyDatabaseId);
	ereport(LOG, (errmsg("pgjq worker started for database \"%s\"", dbname)));

	while (!ShutdownRequestPending)
	{
		long		sleep_ms;

		ResetLatch(MyLatch);
		pgjq_shmem_worker_plan(DT_NOEND);
		check_interrupts();
		if (ShutdownRequestPending)
			break;
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		{
			TimestampTz pass_start = GetCurrentTimestamp();

			sleep_ms = worker_pass(&ws);
			pgjq_shmem_worker_pass_done(pass_start, GetCurrentTimestamp());
		}
		if (ShutdownRequestPending)
			break;

		/*
		 * send this pass's counts to the statistics (a worker never goes
		 * idle)
		 */
		(void) pgstat_report_stat(true);

		if (sleep_ms > 0)
		{
			pgjq_shmem_worker_plan(GetCurrentTimestamp() + (int64) sleep_ms * 1000);
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
							 sleep_ms, pgjq_wait_event(PGJQ_WAIT_WORKER));
		}
	}
	proc_exit(0);
}
