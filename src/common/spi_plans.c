/*-------------------------------------------------------------------------
 *
 * spi_plans.c
 *	  Prepare-once, execute-many SPI plans for the storage engine.
 *
 * Callers must be connected to SPI.  Plans are parsed under the search_path
 * the SQL functions pin (pg_catalog, pg_temp) or that the background worker
 * sets, and every relation is schema-qualified, so no caller-controlled
 * object can be reached.  If the extension is dropped and created again the
 * plan cache revalidates the kept plans from their SQL text.
 *
 *-------------------------------------------------------------------------
 */
#include "common/spi_plans.h"

#include "jit/jit.h"
#include "optimizer/cost.h"
#include "optimizer/planner.h"
#include "utils/snapmgr.h"

static planner_hook_type prev_planner_hook = NULL;
static bool hook_installed = false;

/* The PgjqPlan being executed (and perhaps planned) now, or NULL. */
static PgjqPlan *executing = NULL;

static PlannedStmt *
plan_statement(Query *parse, const char *query_string, int cursorOptions,
			   ParamListInfo boundParams)
{
	PgjqPlan   *p = executing;
	bool		seqscan = enable_seqscan;
	bool		bitmapscan = enable_bitmapscan;
	PlannedStmt *result;

	if (p == NULL || !p->index_paths)
		return prev_planner_hook
			? prev_planner_hook(parse, query_string, cursorOptions, boundParams)
			: standard_planner(parse, query_string, cursorOptions, boundParams);

	/* what is planned while planning this (an inlined function) is this too */
	enable_seqscan = false;
	enable_bitmapscan = false;
	PG_TRY();
	{
		result = prev_planner_hook
			? prev_planner_hook(parse, query_string, cursorOptions, boundParams)
			: standard_planner(parse, query_string, cursorOptions, boundParams);
	}
	PG_FINALLY();
	{
		enable_seqscan = seqscan;
		enable_bitmapscan = bitmapscan;
	}
	PG_END_TRY();

	/*
	 * Never JIT-compiled: a path the settings above disable still costs
	 * disable_cost (1e10), far above jit_above_cost, so a lookup with no
	 * index to walk (job_done's ranges under job(id)) was compiled on every
	 * execution: 150-300 ms for a lookup of 0.1 ms (wait_jobs woke that
	 * late).
	 */
	result->jitFlags = PGJIT_NONE;
	return result;
}

/*
 * Installed at a backend's first pgjq plan, not from _PG_init: a planner
 * hook set while shared_preload_libraries loads would make a library loaded
 * after pgjq that insists on being first (Citus: "Citus has to be loaded
 * first") stop the server.  Installed later, it chains whatever is there.
 */
static void
install_hook(void)
{
	if (hook_installed)
		return;
	prev_planner_hook = planner_hook;
	planner_hook = plan_statement;
	hook_installed = true;
}

static SPIPlanPtr
prepare(PgjqPlan *plan)
{
	if (plan->plan == NULL)
	{
		/*
		 * Always the generic plan: the statements are written to walk the
		 * right index whatever the values, and a custom plan would be
		 * replanned on every call (planning was 12% of a claim's time).
		 */
		SPIPlanPtr	p = SPI_prepare_cursor(plan->sql, plan->nargs, plan->argtypes,
										   CURSOR_OPT_GENERIC_PLAN);

		if (p == NULL)
			elog(ERROR, "pgjq: SPI_prepare failed (%s) for: %s",
				 SPI_result_code_string(SPI_result), plan->sql);
		if (SPI_keepplan(p) != 0)
			elog(ERROR, "pgjq: SPI_keepplan failed");
		plan->plan = p;
	}
	return plan->plan;
}

static int
run(PgjqPlan *plan, Datum *values, const char *nulls, bool read_only, long count,
	Snapshot snapshot)
{
	PgjqPlan   *outer = executing;
	int			rc;

	/* the plan cache (re)plans inside SPI_execute_plan: tell the hook whose */
	install_hook();
	executing = plan;
	PG_TRY();
	{
		if (snapshot != InvalidSnapshot)
			rc = SPI_execute_snapshot(prepare(plan), values, nulls, snapshot,
									  InvalidSnapshot, read_only, false, count);
		else
			rc = SPI_execute_plan(prepare(plan), values, nulls, read_only, count);
	}
	PG_FINALLY();
	{
		executing = outer;
	}
	PG_END_TRY();
	if (rc < 0)
		elog(ERROR, "pgjq: SPI_execute_plan failed (%s) for: %s",
			 SPI_result_code_string(rc), plan->sql);
	return rc;
}

/*
 * Execute a plan; returns the SPI result code.  SPI_processed and
 * SPI_tuptable hold the rows.  Always in SPI's read-write mode, even for
 * reads: that mode takes a fresh snapshot per statement under READ COMMITTED,
 * which the protocols here rely on (the dedup lookup after ON CONFLICT, the
 * queue lookup after its lock) to see what committed meanwhile.
 */
int
pgjq_spi_run(PgjqPlan *plan, Datum *values, const char *nulls, long count)
{
	return run(plan, values, nulls, false, count, InvalidSnapshot);
}

/*
 * The same with the latest snapshot, whatever the isolation level: for a
 * second look at what shared memory let go during the first one (a job whose
 * outcome committed after the first look's snapshot), which the latest
 * snapshot shows, as pgjq's commit callbacks run after the commit is visible.
 */
int
pgjq_spi_run_latest(PgjqPlan *plan, Datum *values, const char *nulls, long count)
{
	return run(plan, values, nulls, false, count, GetLatestSnapshot());
}

/* Column col (1-based) of result row `row` of the last execution. */
Datum
pgjq_spi_get(int row, int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, isnull);
}

int64
pgjq_spi_get_int64(int row, int col)
{
	bool		isnull;
	Datum		d = pgjq_spi_get(row, col, &isnull);

	return isnull ? 0 : DatumGetInt64(d);
}

/*
 * Run a utility statement built by the caller from trusted parts only
 * (partition names and bounds derived from integers).
 */
void
pgjq_spi_exec_utility(const char *sql)
{
	int			rc = SPI_execute(sql, false, 0);

	if (rc < 0)
		elog(ERROR, "pgjq: SPI_execute failed (%s) for: %s",
			 SPI_result_code_string(rc), sql);
}
