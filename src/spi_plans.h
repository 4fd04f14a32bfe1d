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

#include "pgjq.h"

#include "executor/spi.h"

#define PGJQ_PLAN_MAX_ARGS 16

typedef struct PgjqPlan
{
	const char *sql;
	int			nargs;
	Oid			argtypes[PGJQ_PLAN_MAX_ARGS];
	SPIPlanPtr	plan;			/* NULL until first use in this backend */
} PgjqPlan;

extern int	pgjq_spi_run(PgjqPlan *plan, Datum *values, const char *nulls, long count);
extern Datum pgjq_spi_get(int row, int col, bool *isnull);
extern int64 pgjq_spi_get_int64(int row, int col);
extern void pgjq_spi_exec_utility(const char *sql);

#endif							/* PGJQ_SPI_PLANS_H */
