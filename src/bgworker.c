/*-------------------------------------------------------------------------
 *
 * bgworker.c
 *	  The pgjq launcher and its per-database workers: scheduling only; the
 *	  work itself is maintenance.c.
 *
 * The launcher (a static worker registered by _PG_init, no database
 * connection) reads pgjq.database_names and keeps one dynamic worker per
 * listed database: it starts missing ones, stops ones no longer listed, and
 * restarts a worker that died (at most every RESTART_DELAY).  It is woken by
 * the postmaster whenever one of its workers starts or stops (bgw_notify_pid)
 * and by SIGHUP.
 *
 * A database worker loops: rescue expired leases, promote due jobs, prune
 * history every pgjq.prune_interval, each in its own transaction; then sleeps
 * until the next deadline read from the tables (next due job, next lease
 * expiry, next prune), at most pgjq.max_sleep.  A producer that commits a job
 * due earlier wakes it through its latch (shmem.c).  A database without the
 * extension is checked again after pgjq.max_sleep.
 *
 * SIGTERM of a database worker (server shutdown, pg_terminate_backend, a new
 * launcher) is a request: its loop exits cleanly (code 0) at its next turn; a
 * step is a few short statements.  The launcher dies on SIGTERM (code 1), so
 * the postmaster starts it again.  Both start only once recovery has finished, so on a hot standby nothing
 * runs; after promotion the postmaster starts the launcher.  After a crash
 * the postmaster restarts the launcher, which starts the workers again.
 *
 *-------------------------------------------------------------------------
 */
#include "pgjq.h"
#include "limits.h"
#include "horizon.h"

#include "access/xact.h"
#include "commands/extension.h"
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
#define MAX_WORKERS			64

typedef struct LauncherEntry
{
	char		dbname[NAMEDATALEN];
	BackgroundWorkerHandle *handle;
	TimestampTz started_at;
	bool		wanted;
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
 * Reconcile the running workers with the wanted ones; returns how long the
 * launcher may sleep before a worker that died may be restarted.
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
		if (e->handle == NULL || TimestampDifferenceExceeds(e->started_at, now, RESTART_DELAY_MS))
		{
			if (e->handle)
				pfree(e->handle);
			e->handle = NULL;
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
		sleep_ms = reconcile();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* Run one maintenance step in its own transaction. */
static int64
run_step(const char *what, int64 (*step) (void))
{
	int64		n;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, what);
	n = step();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	if (n > 0)
		elog(DEBUG1, "pgjq: %s: " INT64_FORMAT, what, n);
	return n;
}

/* Count the running jobs into shared memory if not done yet (limits.c). */
static int64
rebuild_counters(void)
{
	pgjq_limits_rebuild_if_needed();
	return 0;
}

/* True when the pgjq extension exists in this database. */
static bool
extension_present(void)
{
	bool		present;

	StartTransactionCommand();
	present = OidIsValid(get_extension_oid("pgjq", true));
	CommitTransactionCommand();
	return present;
}

static TimestampTz
next_deadline(void)
{
	TimestampTz t;

	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	t = pgjq_maintenance_next_deadline();
	PopActiveSnapshot();
	CommitTransactionCommand();
	return t;
}

void
pgjq_worker_main(Datum main_arg)
{
	char		dbname[NAMEDATALEN];
	TimestampTz next_prune = 0;

	strlcpy(dbname, MyBgworkerEntry->bgw_extra, NAMEDATALEN);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(dbname, NULL, 0);
	pgstat_report_appname("pgjq worker");

	/* plans are parsed under this path only (see spi_plans.c) */
	SetConfigOption("search_path", "pg_catalog, pg_temp", PGC_SUSET, PGC_S_OVERRIDE);
	pgjq_shmem_worker_attach(MyDatabaseId);
	ereport(LOG, (errmsg("pgjq worker started for database \"%s\"", dbname)));

	for (;;)
	{
		TimestampTz now;
		TimestampTz wake;
		long		sleep_ms;

		ResetLatch(MyLatch);
		pgjq_shmem_worker_plan(DT_NOEND);
		CHECK_FOR_INTERRUPTS();
		if (ShutdownRequestPending)
			proc_exit(0);
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		now = GetCurrentTimestamp();
		wake = now + (int64) pgjq_max_sleep_ms * 1000;
		if (extension_present())
		{
			run_step("pgjq: counters", rebuild_counters);
			run_step("pgjq: rescue", pgjq_maintenance_rescue);
			run_step("pgjq: promote", pgjq_maintenance_promote);
			run_step("pgjq: horizon", pgjq_horizon_check);
			if (now >= next_prune)
			{
				run_step("pgjq: prune", pgjq_maintenance_prune);
				next_prune = now + (int64) pgjq_prune_interval_ms * 1000;
			}
			wake = Min(wake, next_prune);
			wake = Min(wake, next_deadline());
		}

		/*
		 * send this pass's counts to the statistics (a worker never goes
		 * idle)
		 */
		(void) pgstat_report_stat(true);

		now = GetCurrentTimestamp();
		sleep_ms = wake <= now ? MIN_SLEEP_MS :
			Max(MIN_SLEEP_MS, (long) ((wake - now + 999) / 1000));
		pgjq_shmem_worker_plan(now + (int64) sleep_ms * 1000);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
	}
}
