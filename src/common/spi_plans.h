/*-------------------------------------------------------------------------
 *
 * spi_plans.h
 *	  The prepared-plan cache behind the storage engine.
 *
 * A PgjqPlan is a static descriptor (SQL text and argument types) owned by
 * the storage file that uses it; the first execution in a backend prepares
 * it and keeps it with SPI_keepplan.  SQL text is constant: values travel
 * only as $n parameters.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_SPI_PLANS_H
#define PGJQ_SPI_PLANS_H

#include "common/pgjq_common.h"

#include "executor/spi.h"

#define PGJQ_PLAN_MAX_ARGS 16

typedef struct PgjqPlan
{
	const char *sql;
	int			nargs;
	Oid			argtypes[PGJQ_PLAN_MAX_ARGS];
	SPIPlanPtr	plan;			/* NULL until first use in this backend */
	bool		index_paths;	/* planned with seq and bitmap scans off */
} PgjqPlan;

/*
 * index_paths: a plan over pgjq.job, the table that empties and fills again.
 * The plan is generic and kept for the backend's life (a pooled connection's,
 * the worker's), so it is planned once, at whatever size the table had then:
 * planned when VACUUM had truncated pgjq.job to 0 pages (reltuples 0), a
 * lookup by id or the due-jobs pick became a sequential scan, run against
 * 200,000 rows later until something invalidated the plan (FR1's crash
 * phase: the statistics are discarded, so no autovacuum came).  And a pick
 * "ORDER BY run_at LIMIT n" estimated small takes a bitmap scan and a sort,
 * which never marks the index entries of deleted rows dead as an index scan
 * does: those marks are hints, lost at a crash, and each pick walked all the
 * dead entries again.  Such a plan is planned, whenever the plan cache
 * builds it, with enable_seqscan and enable_bitmapscan off (a planner hook,
 * so that executing a kept plan costs nothing more); where no index serves,
 * the planner still takes a sequential scan.  Such plans are never
 * JIT-compiled (spi_plans.c).
 */

extern int	pgjq_spi_run(PgjqPlan *plan, Datum *values, const char *nulls, long count);
extern int	pgjq_spi_run_latest(PgjqPlan *plan, Datum *values, const char *nulls, long count);
extern Datum pgjq_spi_get(int row, int col, bool *isnull);
extern int64 pgjq_spi_get_int64(int row, int col);
extern void pgjq_spi_exec_utility(const char *sql);

#endif							/* PGJQ_SPI_PLANS_H */
