/*-------------------------------------------------------------------------
 *
 * storage_maintenance.c
 *	  The storage side of promote and rescue, and the next deadline the
 *	  background worker sleeps until.
 *
 * Both steps lock the rows they change with SKIP LOCKED, so they never wait
 * on a worker's outcome call; a row skipped now is taken on the next pass.
 * Both work in chunks of a caller-given size: the background worker commits
 * each chunk in its own transaction (maintenance.c).
 *
 *-------------------------------------------------------------------------
 */
#include "storage_internal.h"

#include "miscadmin.h"

/* The id array keeps the UPDATE on primary-key probes whatever the count. */
static PgjqPlan plan_promote = {
	"WITH p AS (UPDATE pgjq.job j SET state = 'r'"
	"            WHERE j.id = ANY (ARRAY(SELECT id FROM pgjq.job"
	"                                     WHERE state = 's' AND run_at <= $1"
	"                                     ORDER BY run_at LIMIT $2 FOR UPDATE SKIP LOCKED))"
	"            RETURNING j.queue_id)"
	" SELECT queue_id, count(*)::int4 FROM p GROUP BY queue_id",
	2, {TIMESTAMPTZOID, INT4OID}
};

static PgjqPlan plan_expired = {
	"SELECT j.id, j.token, j.attempt, j.max_attempts, j.cancel_requested,"
	"       q.backoff_base, q.backoff_max"
	"  FROM pgjq.job j JOIN pgjq.queue q ON q.queue_id = j.queue_id"
	" WHERE j.state = 'a' AND j.lease_until < $1"
	" ORDER BY j.lease_until LIMIT $2"
	"   FOR UPDATE OF j SKIP LOCKED",
	2, {TIMESTAMPTZOID, INT4OID}
};

static PgjqPlan plan_next_deadline = {
	"SELECT least((SELECT min(run_at) FROM pgjq.job WHERE state = 's'),"
	"             (SELECT min(lease_until) FROM pgjq.job WHERE state = 'a'))",
	0, {InvalidOid}
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
 * Lock up to `limit` running jobs whose lease ended before `now` and
 * describe them (in the result context).  Returns how many.
 */
int
pgjq_storage_expired(TimestampTz now, int limit, PgjqRunningJob **jobs)
{
	Datum		values[2] = {TimestampTzGetDatum(now), Int32GetDatum(limit)};
	PgjqRunningJob *out;
	int			n;

	pgjq_spi_run(&plan_expired, values, NULL, 0);
	n = (int) SPI_processed;
	out = MemoryContextAlloc(pgjq_result_cxt, sizeof(PgjqRunningJob) * Max(n, 1));
	for (int r = 0; r < n; r++)
	{
		bool		isnull;

		out[r].id = pgjq_spi_get_int64(r, 1);
		out[r].token = pgjq_spi_get_int64(r, 2);
		out[r].attempt = DatumGetInt32(pgjq_spi_get(r, 3, &isnull));
		out[r].max_attempts = DatumGetInt32(pgjq_spi_get(r, 4, &isnull));
		out[r].cancel_requested = DatumGetBool(pgjq_spi_get(r, 5, &isnull));
		out[r].backoff_base_us = pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(r, 6, &isnull)));
		out[r].backoff_max_us = pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(r, 7, &isnull)));
	}
	*jobs = out;
	return n;
}

/*
 * The earliest time a scheduled job falls due or a lease ends, or
 * DT_NOEND when there is none.
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
