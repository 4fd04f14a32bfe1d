/*-------------------------------------------------------------------------
 *
 * verify.c
 *	  SQL API: verify(), which cross-checks what pgjq keeps in shared memory
 *	  against its durable records, and the durable records against each
 *	  other, and returns every disagreement (no rows when healthy).
 *
 * Two kinds of checks:
 * - durable invariants of the storage engine (storage_verify.c): every
 *   running job has a lease and a token, every job's queue exists, no job is
 *   both unfinished and finished, the id and token sequences are above every
 *   id and token in use, the history partitions and their registry agree;
 * - shared memory against the tables (limits.c): the running counts behind
 *   concurrency and key_concurrency limits;
 * - the ring engine's shared memory against its tables (engine/ring_verify.c): the
 *   ready and running ring jobs and each slot's unfinished count.
 * A transaction that claims or finishes jobs while verify() runs makes the
 * counters and the table differ until it ends, so a difference is reported
 * only if it is still there after the counters were read again for up to a
 * second.  On a quiet database (the test suite runs it at the end of each
 * group) the answer is exact.  It reads every unfinished job and the whole
 * history: an operator's and a test's tool, not for every minute.
 *
 *-------------------------------------------------------------------------
 */
#include "common/args.h"
#include "state/limits_verify.h"
#include "common/spi_plans.h"
#include "engine/engine.h"

#include "miscadmin.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(pgjq_verify);

#define VERIFY_TRIES 20
#define VERIFY_PAUSE_US 50000

static void
put(ReturnSetInfo *rsinfo, const char *area, const char *object, const char *expected,
	const char *found)
{
	Datum		values[4];
	bool		nulls[4] = {0};

	values[0] = CStringGetTextDatum(area);
	values[1] = CStringGetTextDatum(object);
	values[2] = CStringGetTextDatum(expected);
	values[3] = CStringGetTextDatum(found);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
}

Datum
pgjq_verify(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	PgjqVerifyRow *rows;
	PgjqLimitsDiff *diffs = NULL;
	int			nrows;
	int			ndiffs = 0;

	pgjq_srf_materialize(fcinfo);
	pgjq_storage_begin();
	nrows = pgjq_storage_verify(&rows);
	for (int i = 0; i < nrows; i++)
		put(rsinfo, rows[i].area, rows[i].object, rows[i].expected, rows[i].found);
	nrows = pgjq_ring_verify(&rows);
	for (int i = 0; i < nrows; i++)
		put(rsinfo, rows[i].area, rows[i].object, rows[i].expected, rows[i].found);

	for (int attempt = 0; attempt < VERIFY_TRIES; attempt++)
	{
		if (attempt > 0)
		{
			pg_usleep(VERIFY_PAUSE_US);
			CHECK_FOR_INTERRUPTS();
		}
		ndiffs = pgjq_limits_verify(&diffs);
		if (ndiffs == 0)
			break;
	}
	for (int i = 0; i < ndiffs; i++)
	{
		char	   *object = diffs[i].fair_key == NULL ?
		psprintf("queue_id %d: running jobs", diffs[i].queue_id) :
		psprintf("queue_id %d, fair_key %s: running jobs", diffs[i].queue_id,
				 diffs[i].fair_key);

		put(rsinfo, "limits", object, psprintf("%d", diffs[i].expected),
			psprintf("%d", diffs[i].found));
	}
	pgjq_storage_end();
	return (Datum) 0;
}
