/*-------------------------------------------------------------------------
 *
 * guc.c
 *	  pgjq's settings, defined in one block; the "pgjq" prefix is reserved.
 *
 *	  pgjq.database_names     databases the background worker serves (sighup)
 *	  pgjq.max_sleep          longest worker sleep between passes (sighup)
 *	  pgjq.prune_interval     how often the worker prunes history (sighup)
 *	  pgjq.max_payload_size   largest payload enqueue accepts (superuser)
 *	  pgjq.max_wait           longest wait of a waiting claim (superuser)
 *	  pgjq.horizon_warn_after the worker warns when the xmin horizon is held
 *	                          this long; 0 turns it off (sighup)
 *	  pgjq.max_tracked_keys   shared-memory entries for the limit counters
 *	                          (postmaster: sizes shared memory)
 *	  pgjq.max_databases      databases whose limits are tracked at once
 *	                          (postmaster: sizes shared memory)
 *	  pgjq.max_metrics_queues entries for the per-queue metrics counters
 *	                          (postmaster: sizes shared memory)
 *	  pgjq.max_metrics_claims claims remembered for the run-time histogram
 *	                          (postmaster: sizes shared memory)
 *	  pgjq.ring_positions, pgjq.ring_max_in_flight, pgjq.ring_max_lanes, pgjq.ring_max_holds,
 *	  pgjq.ring_max_rate_keys,
 *	  pgjq.ring_max_queues    the ring engine's shared-memory bounds
 *	                          (postmaster: size shared memory)
 *	  pgjq.ring_slot_rows     bodies per ring slot before producers move to
 *	                          the next one (superuser)
 *	  pgjq.debug_crash_at     test only: crash at a named point (superuser;
 *	                          crash_points.c)
 *	  pgjq.debug_pause_at     test only: sleep 3 s at a named point (superuser)
 *	  pgjq.debug_worker_step_ms test only: the background worker holds each
 *	                          step's transaction open this long (sighup)
 *
 *-------------------------------------------------------------------------
 */
#include "common/guc.h"
#include "common/crash_points.h"

#include "miscadmin.h"
#include "utils/guc.h"

char	   *pgjq_database_names = NULL;
int			pgjq_max_payload_size = 1024;
int			pgjq_max_sleep_ms = 10000;
int			pgjq_debug_worker_step_ms = 0;
int			pgjq_prune_interval_ms = 60000;
int			pgjq_max_tracked_keys = 65536;
int			pgjq_max_databases = 64;
int			pgjq_max_wait_ms = 20000;
int			pgjq_horizon_warn_after_s = 300;
int			pgjq_max_metrics_queues = 4096;
int			pgjq_max_metrics_claims = 65536;
int			pgjq_ring_positions = 1048576;
int			pgjq_ring_max_in_flight = 65536;
int			pgjq_ring_max_lanes = 65536;
int			pgjq_ring_max_holds = 4096;
int			pgjq_ring_max_rate_keys = 16384;
int			pgjq_ring_max_queues = 1024;
int			pgjq_ring_slot_rows = 100000;

/* pgjq.debug_crash_at names a point of crash_points.c, or nothing */
static bool
check_crash_point(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0' ||
		strcmp(*newval, "commit") == 0 || strcmp(*newval, "worker_chunk") == 0 ||
		strcmp(*newval, "worker_reclaim") == 0 || strcmp(*newval, "ring_relocate") == 0 ||
		strcmp(*newval, "ring_job_live") == 0)
		return true;
	GUC_check_errdetail("Known points: commit, worker_chunk, worker_reclaim, ring_relocate, ring_job_live.");
	return false;
}

void
pgjq_guc_init(void)
{
	DefineCustomStringVariable("pgjq.database_names",
							   "Comma-separated databases the pgjq background worker serves.",
							   "Databases without the extension are checked again after pgjq.max_sleep.",
							   &pgjq_database_names,
							   "postgres",
							   PGC_SIGHUP,
							   GUC_LIST_INPUT,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.max_sleep",
							"Longest time the pgjq worker sleeps between maintenance passes.",
							"The worker wakes earlier for the next due job or lease expiry.",
							&pgjq_max_sleep_ms,
							10000, 10, 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.prune_interval",
							"How often the pgjq worker prunes finished history.",
							NULL,
							&pgjq_prune_interval_ms,
							60000, 1000, 24 * 3600 * 1000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.max_payload_size",
							"Largest job payload accepted by enqueue.",
							NULL,
							&pgjq_max_payload_size,
							1024, 1, 1024 * 1024,
							PGC_SUSET,
							GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.max_wait",
							"Longest time a claim with wait sleeps.",
							"Longer waits are cut to this.",
							&pgjq_max_wait_ms,
							20000, 0, 3600 * 1000,
							PGC_SUSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.horizon_warn_after",
							"The pgjq worker warns when the xmin horizon has been held this long.",
							"One WARNING names the holder (session, prepared transaction or replication slot), one LOG line its release; 0 turns the warning off.",
							&pgjq_horizon_warn_after_s,
							300, 0, 30 * 24 * 3600,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomStringVariable("pgjq.debug_crash_at",
							   "Test only: the process kills itself (SIGKILL) at this point.",
							   "Points: commit (after the commit record, before pgjq's shared memory follows it), worker_chunk (in the background worker, between two committed chunks), worker_reclaim (likewise, between two steps of giving the ring's space back), ring_relocate (after a relocation wrote its copies, before it commits), ring_job_live (in job(id) of a ring job, between the snapshot's read and shared memory's).  Empty: never.",
							   &pgjq_debug_crash_at,
							   "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE,
							   check_crash_point, NULL, NULL);

	DefineCustomStringVariable("pgjq.debug_pause_at",
							   "Test only: the process sleeps 3 seconds at this point.",
							   "The points of pgjq.debug_crash_at.  Empty: never.",
							   &pgjq_debug_pause_at,
							   "",
							   PGC_SUSET,
							   GUC_NOT_IN_SAMPLE,
							   check_crash_point, NULL, NULL);

	DefineCustomIntVariable("pgjq.debug_worker_step_ms",
							"Test only: the background worker keeps each step's transaction open this long after its work.",
							"So that a test's DDL meets the worker inside every step of its pass.  0: never.",
							&pgjq_debug_worker_step_ms,
							0, 0, 10000,
							PGC_SIGHUP,
							GUC_NOT_IN_SAMPLE | GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("pgjq.ring_slot_rows",
							"Job bodies a ring slot takes before producers move to the next slot.",
							"A slot comes back by TRUNCATE once all its jobs are finished.",
							&pgjq_ring_slot_rows,
							100000, 1, PG_INT32_MAX,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	/* sizes shared memory: only when preloaded, as PGC_POSTMASTER demands */
	if (process_shared_preload_libraries_in_progress)
	{
		DefineCustomIntVariable("pgjq.max_tracked_keys",
								"Shared-memory entries for the limit counters (queues with running jobs and running fair keys of key-limited queues).",
								"A claim that needs an entry when all are taken fails.",
								&pgjq_max_tracked_keys,
								65536, 16, 16 * 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.max_databases",
								"Databases whose queue limits pgjq tracks at once.",
								"Slots of dropped databases are reused.",
								&pgjq_max_databases,
								64, 1, 65536,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_positions",
								"Ready jobs of ring queues that shared memory holds (all databases), including those being enqueued or claimed.",
								"An enqueue that would need more fails; 24 bytes each.",
								&pgjq_ring_positions,
								1048576, 1024, 256 * 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_max_in_flight",
								"Running jobs of ring queues that shared memory holds (all databases).",
								"A claim at the bound takes fewer jobs.",
								&pgjq_ring_max_in_flight,
								65536, 64, 64 * 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_max_lanes",
								"Lanes (queue, priority, fair key) with ready or running ring jobs (all databases).",
								"An enqueue that needs a new lane at the bound fails.",
								&pgjq_ring_max_lanes,
								65536, 16, 64 * 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_max_holds",
								"Fair keys held with hold_key() (or fail(..., hold_key_for)) at once (all databases).",
								"A hold of one more key at the bound fails.",
								&pgjq_ring_max_holds,
								4096, 16, 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_max_rate_keys",
								"Fair keys of queues with key_rate whose token bucket is not full (all databases).",
								"A claim that needs one more at the bound takes nothing more (an error if it took nothing).",
								&pgjq_ring_max_rate_keys,
								16384, 16, 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.ring_max_queues",
								"Ring queues with jobs that shared memory tracks at once (all databases).",
								"An enqueue that needs a new entry at the bound fails.",
								&pgjq_ring_max_queues,
								1024, 16, 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.max_metrics_queues",
								"Shared-memory entries for the per-queue counters of pgjq.metrics() (all databases).",
								"Counts of queues beyond it go to pgjq_metrics_overflow_total.",
								&pgjq_max_metrics_queues,
								4096, 16, 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
		DefineCustomIntVariable("pgjq.max_metrics_claims",
								"Claims whose start pgjq remembers for the job run-time histogram.",
								"Outcomes of older claims count in pgjq_job_run_unknown_total.",
								&pgjq_max_metrics_claims,
								65536, 16, 64 * 1024 * 1024,
								PGC_POSTMASTER,
								0,
								NULL, NULL, NULL);
	}

	MarkGUCPrefixReserved("pgjq");
}
