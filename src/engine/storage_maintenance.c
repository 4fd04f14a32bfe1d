/*-------------------------------------------------------------------------
 *
 * storage_maintenance.c
 *	  Promotion of due jobs that the ring has no room for, and the next due
 *	  time in pgjq.job, which the background worker sleeps until.
 *
 * Promotion locks the rows it changes with SKIP LOCKED, so it never waits;
 * a row skipped now is taken on the next pass.  It works in chunks of a
 * caller-given size: the background worker commits each chunk in its own
 * transaction (maintenance.c).  Leases are the ring's (ring_outcome.c).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/storage_internal.h"

#include "miscadmin.h"

/* The id array keeps the UPDATE on primary-key probes whatever the count. */
static PgjqPlan plan_promote = {
	"WITH p AS (UPDATE pgjq.job j SET state = 'r'"
	"            WHERE j.id = ANY (ARRAY(SELECT id FROM pgjq.job"
	"                                     WHERE state = 's' AND run_at <= $1"
	"                                     ORDER BY run_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
	"            RETURNING j.queue_id)"
	" SELECT queue_id, count(*)::int4 FROM p GROUP BY queue_id",
	2, {TIMESTAMPTZOID, INT4OID}, NULL, true
};

static PgjqPlan plan_next_deadline = {
	"SELECT min(run_at) FROM pgjq.job WHERE state = 's'",
	0, {InvalidOid}, NULL, true
};

/*
 * Make up to `limit` scheduled jobs due at `now` ready, the earliest first;
 * returns how many.  A result below `limit` means none is left that is not
 * locked by someone else.
 */
int64
pgjq_storage_promote(TimestampTz now, int limit)
{
	Datum		values[2] = {TimestampTzGetDatum(now), Int32GetDatum(limit)};
	int64		n = 0;

	pgjq_spi_run(&plan_promote, values, NULL, 0);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;
		int32		count = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));

		n += count;
		if (pgjq_became_ready_hook)
			pgjq_became_ready_hook(DatumGetInt32(pgjq_spi_get(r, 1, &isnull)), count);
	}
	return n;
}

/*
 * The earliest time a scheduled job falls due, or DT_NOEND when there is
 * none.
 */
TimestampTz
pgjq_storage_next_deadline(void)
{
	bool		isnull;
	Datum		d;

	pgjq_spi_run(&plan_next_deadline, NULL, NULL, 1);
	d = pgjq_spi_get(0, 1, &isnull);
	return isnull ? DT_NOEND : DatumGetTimestampTz(d);
}
