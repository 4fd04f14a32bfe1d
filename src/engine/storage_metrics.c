/*-------------------------------------------------------------------------
 *
 * storage_metrics.c
 *	  The storage side of metrics(): per queue, how many jobs are ready,
 *	  scheduled, waiting for dependencies, running and dead, the oldest
 *	  ready job and the next scheduled one, and how many fair keys are held
 *	  (hold_key).
 *
 * Read only, computed when asked.  Each state is counted on its own partial
 * index (ready, scheduled and waiting in pgjq.job; dead in each job_history
 * partition), so a count reads the rows of its state only; the cost grows
 * with the backlog, not with the finished history (bench/metrics).  The
 * ring's ready and running jobs are added from shared memory (ring.h).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring.h"
#include "engine/storage_internal.h"

#include "utils/builtins.h"

#define GAUGES_SELECT \
	"SELECT q.queue_id, q.name, COALESCE(r.n, 0), COALESCE(s.n, 0), COALESCE(d.n, 0)," \
	"       extract(epoch FROM $1 - r.oldest)::float8," \
	"       extract(epoch FROM s.next - $1)::float8, COALESCE(h.n, 0), COALESCE(w.n, 0)" \
	"  FROM pgjq.queue q"

#define GAUGES_JOINS(filter) \
	"  LEFT JOIN (SELECT queue_id, count(*) AS n, min(run_at) AS oldest FROM pgjq.job" \
	"              WHERE state = 'r' " filter " GROUP BY queue_id) r ON r.queue_id = q.queue_id" \
	"  LEFT JOIN (SELECT queue_id, count(*) AS n, min(run_at) AS next FROM pgjq.job" \
	"              WHERE state = 's' " filter " GROUP BY queue_id) s ON s.queue_id = q.queue_id" \
	"  LEFT JOIN (SELECT queue_id, count(*) AS n FROM pgjq.job_history" \
	"              WHERE state = 'd' " filter " GROUP BY queue_id) d ON d.queue_id = q.queue_id" \
	"  LEFT JOIN (SELECT queue_id, count(*) AS n FROM pgjq.key_holds" \
	"              WHERE until > $1 " filter " GROUP BY queue_id) h ON h.queue_id = q.queue_id" \
	"  LEFT JOIN (SELECT queue_id, count(*) AS n FROM pgjq.job" \
	"              WHERE state = 'w' " filter " GROUP BY queue_id) w ON w.queue_id = q.queue_id"

static PgjqPlan plan_gauges_all = {
	GAUGES_SELECT GAUGES_JOINS("") " ORDER BY q.name",
	1, {TIMESTAMPTZOID}
};

static PgjqPlan plan_gauges_one = {
	GAUGES_SELECT GAUGES_JOINS("AND queue_id = $2") " WHERE q.queue_id = $2",
	2, {TIMESTAMPTZOID, INT4OID}
};

/*
 * The gauges of one queue (queue_id > 0) or of every queue, by name; the
 * array is allocated in the caller's context.  Returns how many.
 */
int
pgjq_storage_queue_gauges(int32 queue_id, TimestampTz now, PgjqQueueGauges **gauges)
{
	Datum		values[2] = {TimestampTzGetDatum(now), Int32GetDatum(queue_id)};
	MemoryContext old;
	PgjqQueueGauges *g;
	int			n;

	pgjq_spi_run(queue_id > 0 ? &plan_gauges_one : &plan_gauges_all, values, NULL, 0);
	n = (int) SPI_processed;
	old = MemoryContextSwitchTo(pgjq_result_cxt);
	g = palloc0(sizeof(PgjqQueueGauges) * Max(n, 1));
	for (int r = 0; r < n; r++)
	{
		bool		isnull;
		Datum		d;

		g[r].queue_id = DatumGetInt32(pgjq_spi_get(r, 1, &isnull));
		g[r].name = TextDatumGetCString(pgjq_spi_get(r, 2, &isnull));
		g[r].ready = DatumGetInt64(pgjq_spi_get(r, 3, &isnull));
		g[r].scheduled = DatumGetInt64(pgjq_spi_get(r, 4, &isnull));
		g[r].dead = DatumGetInt64(pgjq_spi_get(r, 5, &isnull));
		d = pgjq_spi_get(r, 6, &isnull);
		g[r].has_oldest_ready = !isnull;
		if (!isnull)
			g[r].oldest_ready_age = DatumGetFloat8(d);
		d = pgjq_spi_get(r, 7, &isnull);
		g[r].has_next_scheduled = !isnull;
		if (!isnull)
			g[r].next_scheduled_in = DatumGetFloat8(d);
		g[r].held_keys = DatumGetInt64(pgjq_spi_get(r, 8, &isnull));
		g[r].waiting = DatumGetInt64(pgjq_spi_get(r, 9, &isnull));
		{
			int64		ready,
						running;
			TimestampTz oldest;

			pgjq_ring_counts(g[r].queue_id, true, &ready, &running, &oldest);
			/* running jobs are the ring's only */
			g[r].ready += ready;
			g[r].running = running;
			if (oldest != 0)
			{
				double		age = (double) (now - oldest) / USECS_PER_SEC;

				if (!g[r].has_oldest_ready || age > g[r].oldest_ready_age)
					g[r].oldest_ready_age = age;
				g[r].has_oldest_ready = true;
			}
		}
	}
	MemoryContextSwitchTo(old);
	*gauges = g;
	return n;
}
