/*-------------------------------------------------------------------------
 *
 * outcome.h
 *	  The outcomes of attempts (outcome.c): fail, rescue and a worker's
 *	  cycle, for the other SQL functions and the maintenance steps.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_OUTCOME_H
#define PGJQ_OUTCOME_H

#include "engine/engine.h"

/* the outcome of a failed attempt (fail, rescue), and applying it */
extern char pgjq_outcome_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
							  TimestampTz now);
extern char pgjq_outcome_rescue_ring(int64 id, int64 token, TimestampTz now);

/* the outcomes of a worker's cycle (complete_and_claim) */
extern int64 pgjq_outcome_cycle(int n, Datum *ids, Datum *tokens, Datum *errors,
								bool *error_nulls, Datum *results, bool *result_nulls,
								TimestampTz now);

/* a results argument (jsonb[]) checked; -1 when NULL or absent */
extern int	pgjq_outcome_results(FunctionCallInfo fcinfo, int argno, Datum **values,
								 bool **nulls);

#endif							/* PGJQ_OUTCOME_H */
