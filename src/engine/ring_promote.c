/*-------------------------------------------------------------------------
 *
 * ring_promote.c
 *	  Promotion into the ring: due scheduled jobs, jobs whose
 *	  dependencies were released, and ready rows of pgjq.job move into the
 *	  ring as each job's next version.
 *
 * Order: the rows are picked (FOR UPDATE, SKIP LOCKED for the worker's
 * pass); a job that still has an in-flight entry is left; lanes are pinned
 * under the ring's LWLock (exclusive), and a job whose queue or lane the
 * ring has no room for stays in pgjq.job (counted for health()); then the
 * rows leave pgjq.job (deleted, or turned into their dedup anchor) and are
 * appended and published as an enqueue's (ring_enqueue.c); the pins go in
 * any case.  Taken no further than the ring has room for positions now.
 * Before the rows leave pgjq.job the batch takes the promotion lock
 * (pgjq_storage_promotion_lock), held to the end of its transaction, after
 * the commit callbacks that publish it: a move's drain check waits on it.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring_store_internal.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "storage/proc.h"
#include "storage/procarray.h"

/* ---------------------------------------------------------------------
 * promotion: due jobs of ring queues from pgjq.job into the ring
 * --------------------------------------------------------------------- */

/*
 * The due scheduled jobs of ring queues, the earliest first; locked rows are
 * skipped.  With the xmin of each, then taken out of pgjq.job by id, ordered
 * by queue for ring_append_and_publish: deleted, or for a job with a dedup_key
 * turned into its anchor (state 'n', the payload dropped), so that the key
 * stays held without a gap.
 */
static PgjqPlan plan_promote_pick = {
	"SELECT s.id, s.xmin, s.queue_id, s.priority, s.fair_key FROM pgjq.job s"
	" WHERE s.state = 's' AND s.run_at <= $1"
	" ORDER BY s.run_at LIMIT $2"
	"   FOR UPDATE OF s SKIP LOCKED",
	2, {TIMESTAMPTZOID, INT4OID}, NULL, true
};
static PgjqPlan plan_promote_out = {
	"WITH d AS (DELETE FROM pgjq.job j WHERE j.id = ANY ($1) AND j.dedup_key IS NULL"
	"            RETURNING j.id, j.queue_id, j.priority, j.fair_key, j.attempt, j.max_attempts,"
	"                      j.token, j.enqueued_at, j.payload, j.last_error, j.run_at, j.dedup_key,"
	"                      j.timeout, j.dedup_scope),"
	" a AS (UPDATE pgjq.job j SET state = 'n', payload = '{}', last_error = NULL, worker = NULL"
	"         FROM pgjq.job o WHERE o.id = j.id AND j.id = ANY ($1) AND j.dedup_key IS NOT NULL"
	"            RETURNING o.id, o.queue_id, o.priority, o.fair_key, o.attempt, o.max_attempts,"
	"                      o.token, o.enqueued_at, o.payload, o.last_error, o.run_at, o.dedup_key,"
	"                      o.timeout, o.dedup_scope)"
	" SELECT * FROM (SELECT * FROM d UNION ALL SELECT * FROM a) x ORDER BY queue_id, run_at, id",
	1, {INT8ARRAYOID}, NULL, true
};

/*
 * Promotion into the ring: up to `limit` due jobs move from
 * pgjq.job into the ring as the job's next version (same id; after_token =
 * the token of the claim whose outcome scheduled it, 0 for a delayed job
 * never claimed; the attempt about to run), behind the ready jobs of their
 * lane.  So a retried, snoozed, rescued or delayed job is claimed by the
 * ring's one round robin.  Returns how many; the caller makes the rest
 * ready rows of pgjq.job (pgjq_storage_promote), which claims move into the
 * ring later.  Taken no further than the ring has room for positions now,
 * so a full ring leaves jobs to pgjq.job instead of failing the promotion.
 */
/* How many jobs a promotion may append now: half the free positions when fewer than limit. */
static int
promote_room(int limit)
{
	int64		room;

	LWLockAcquire(ring->lock, LW_SHARED);
	room = (int64) pgjq_ring_positions - ring->count - ring->reserved - ring->held;
	LWLockRelease(ring->lock);
	if (room < limit)
		limit = (int) Max(room / 2, 0);
	return limit;
}

/* What refused a promotion (RingDb.refused_bound), as the errors name it. */
static const char *const refused_names[] = {"", "queues", "lanes"};

/*
 * Lock held: pins[i] = the lane of picked row i, pinned so that it stays
 * until the row is appended (made, and its queue's record and priority ring
 * too, if missing), or NULL where the ring has no room for one of them: that
 * row stays in pgjq.job.  Returns how many were refused; *bound says by what.
 */
static int
promote_pin(int n, const RingLaneKey *keys, const int16 *prios, RingLane **pins, int *bound)
{
	int			refused = 0;

	for (int i = 0; i < n; i++)
	{
		RingQueue  *q = ring_queue_get(keys[i].queue_id, true);
		int			why = 0;

		pins[i] = NULL;
		/* a lane that fits finds room for its priority's ring (ring_prios) */
		if (q == NULL)
			why = 1;
		else if ((pins[i] = ring_lane_get(&keys[i], q)) == NULL)
			why = 2;
		if (why != 0)
		{
			refused++;
			*bound = why;
			continue;
		}
		pins[i]->pinned++;
	}
	return refused;
}

/* Lock not held: the pins of promote_pin go. */
static void
promote_unpin(int n, RingLane **pins)
{
	if (LWLockHeldByMe(ring->lock))
		LWLockRelease(ring->lock);	/* an error under it, on the way out */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
		if (pins[i] != NULL)
		{
			pins[i]->pinned--;
			ring_lane_settle(pins[i]);
		}
	LWLockRelease(ring->lock);
}

/*
 * Due jobs the ring had no room for (a queue record or a lane): counted in the database's ring state for health(), and said in the
 * log once, not at every pass (again once none was refused for a while).
 */
#define REFUSED_LOG_AGAIN_US	(600 * USECS_PER_SEC)

static void
promote_refused(int n, int bound)
{
	RingDb	   *db;
	TimestampTz now = GetCurrentTimestamp();
	bool		say = false;

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db_find();
	if (db != NULL)
	{
		say = db->refused_at == 0 || now - db->refused_at > REFUSED_LOG_AGAIN_US;
		db->refused += n;
		db->refused_at = now;
		db->refused_bound = bound;
	}
	LWLockRelease(ring->lock);
	if (say)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more %s: %d due jobs stay ready in pgjq.job",
						refused_names[bound], n),
				 errdetail("pgjq.ring_max_lanes = %d, pgjq.ring_max_queues = %d.",
						   pgjq_ring_max_lanes, pgjq_ring_max_queues),
				 errhint("Claims take them once the ring has room; pgjq.health() counts them.  Raise the setting and restart the server, or let workers drain the ring queues.")));
}

/*
 * The rows the last pick statement returned (id, xmin, queue_id, priority,
 * fair_key) out of pgjq.job and into the ring as each job's next version.
 * A job that still has an in-flight entry (failed, snoozed or ended dead by
 * this transaction, or by one whose commit has not reached its callback
 * yet: the entry goes there) stays in pgjq.job: one id has one entry, and
 * the worker or the next claim promotes it later.  So does a job whose
 * queue, lane or priority the ring has no room for: checked (and its lane
 * pinned) before any row moves, so that one such job never fails the
 * promotion of the others (the caller makes it a ready row of pgjq.job).
 */
static int	promote_moved(int n, int64 *ids);

static int64
promote_picked(void)
{
	int			n = 0;
	int64	   *ids;
	RingLaneKey *keys;
	int16	   *prios;
	RingLane  **pins;
	int			npins;
	int			refused;
	int			bound = 0;
	uint64		picked = SPI_processed;

	ids = palloc(sizeof(int64) * Max(picked, 1));
	keys = palloc(sizeof(RingLaneKey) * Max(picked, 1));
	prios = palloc(sizeof(int16) * Max(picked, 1));
	pins = palloc(sizeof(RingLane *) * Max(picked, 1));
	for (uint64 r = 0; r < picked; r++)
	{
		bool		isnull;
		text	   *fk = DatumGetTextPP(pgjq_spi_get((int) r, 5, &isnull));

		ids[n] = pgjq_spi_get_int64((int) r, 1);
		prios[n] = DatumGetInt16(pgjq_spi_get((int) r, 4, &isnull));
		ring_lane_key(&keys[n], DatumGetInt32(pgjq_spi_get((int) r, 3, &isnull)), prios[n],
					  VARDATA_ANY(fk), VARSIZE_ANY_EXHDR(fk));
		n++;
	}
	if (n > 0)
	{
		int			m = 0;

		LWLockAcquire(ring->lock, LW_SHARED);
		for (int i = 0; i < n; i++)
			if (ring_flight_find(ids[i]) == NULL)
			{
				ids[m] = ids[i];
				keys[m] = keys[i];
				prios[m] = prios[i];
				m++;
			}
		LWLockRelease(ring->lock);
		n = m;
	}
	if (n == 0)
		return 0;

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	refused = promote_pin(n, keys, prios, pins, &bound);
	LWLockRelease(ring->lock);
	npins = n;
	if (refused > 0)
	{
		int			m = 0;

		promote_refused(refused, bound);
		for (int i = 0; i < n; i++)
			if (pins[i] != NULL)
				ids[m++] = ids[i];
		n = m;
	}
	PG_TRY();
	{
		n = n == 0 ? 0 : promote_moved(n, ids);
	}
	PG_FINALLY();
	{
		promote_unpin(npins, pins);
	}
	PG_END_TRY();
	return n;
}

/* The ids out of pgjq.job and into the ring (their lanes pinned). */
static int
promote_moved(int n, int64 *ids)
{
	Datum		values[1];
	BodyRow    *rows;
	MemoryContext old;

	values[0] = PointerGetDatum(ring_int8_array(ids, n));

	/*
	 * a move's drain check waits for this batch's publication
	 * (storage_queue.c)
	 */
	pgjq_storage_promotion_lock();
	pgjq_spi_run(&plan_promote_out, values, NULL, 0);
	n = (int) SPI_processed;
	if (n == 0)
		return 0;
	old = MemoryContextSwitchTo(pgjq_result_cxt);
	rows = palloc(sizeof(BodyRow) * n);
	for (int r = 0; r < n; r++)
	{
		BodyRow    *b = &rows[r];
		bool		isnull;
		Datum		d;

		b->id = pgjq_spi_get_int64(r, 1);
		b->queue_id = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));
		b->priority = DatumGetInt16(pgjq_spi_get(r, 3, &isnull));
		d = pgjq_spi_get(r, 4, &isnull);
		b->fair_key = isnull || VARSIZE_ANY_EXHDR(DatumGetPointer(d)) == 0 ? (Datum) 0
			: datumCopy(d, false, -1);
		/* pgjq.job counts attempts made; a body, the one it is for */
		b->attempt = DatumGetInt32(pgjq_spi_get(r, 5, &isnull)) + 1;
		b->max_attempts = DatumGetInt32(pgjq_spi_get(r, 6, &isnull));
		b->after = pgjq_spi_get_int64(r, 7);
		b->enqueued_at = DatumGetTimestampTz(pgjq_spi_get(r, 8, &isnull));
		b->payload = datumCopy(pgjq_spi_get(r, 9, &isnull), false, -1);
		d = pgjq_spi_get(r, 10, &isnull);
		b->last_error = isnull ? (Datum) 0 : datumCopy(d, false, -1);
		b->run_at = DatumGetTimestampTz(pgjq_spi_get(r, 11, &isnull));
		d = pgjq_spi_get(r, 12, &isnull);
		b->dedup_key = isnull ? (Datum) 0 : datumCopy(d, false, -1);
		d = pgjq_spi_get(r, 13, &isnull);
		b->timeout_us = isnull ? 0 : pgjq_interval_usec(DatumGetIntervalP(d));
		d = pgjq_spi_get(r, 14, &isnull);
		b->dedup_scope = isnull || b->dedup_key == (Datum) 0 ? 0 : DatumGetChar(d);
	}
	MemoryContextSwitchTo(old);
	for (int a = 0, z; a < n; a = z)
	{
		for (z = a + 1; z < n && rows[z].queue_id == rows[a].queue_id; z++)
			;
		ring_append_and_publish(rows[a].queue_id, z - a, rows + a);
	}
	return n;
}

/*
 * Jobs waiting for dependencies that were just released (deps.c), straight
 * from their 'w' rows into the ring, in the caller's transaction: a claim
 * then finds them in a lane without moving them first.  Those the ring has
 * no room for stay as they are.  Returns how many moved.
 */
static PgjqPlan plan_promote_waiting_pick = {
	"SELECT j.id, j.xmin, j.queue_id, j.priority, j.fair_key FROM pgjq.job j"
	" WHERE j.id = ANY ($1) AND j.state = 'w'"
	" ORDER BY j.id FOR UPDATE",
	1, {INT8ARRAYOID}, NULL, true
};

int64
pgjq_ring_promote_waiting(int n, const int64 *ids)
{
	Datum		values[1];

	if (ring == NULL || n <= 0 || !ring_ensure_ready(false))
		return 0;
	if (promote_room(n) < n)
		return 0;
	values[0] = PointerGetDatum(ring_int8_array((int64 *) ids, n));
	pgjq_spi_run(&plan_promote_waiting_pick, values, NULL, 0);
	return promote_picked();
}

int64
pgjq_ring_promote(TimestampTz now, int limit)
{
	Datum		values[2];

	if (ring == NULL || limit <= 0 || !ring_ensure_ready(false))
		return 0;
	limit = promote_room(limit);
	if (limit <= 0)
		return 0;
	values[0] = TimestampTzGetDatum(now);
	values[1] = Int32GetDatum(limit);
	pgjq_spi_run(&plan_promote_pick, values, NULL, 0);
	return promote_picked();
}

/*
 * Ready rows of a ring queue in pgjq.job (a backlog that found the ring full,
 * dead jobs redriven, 0.1.0's ready jobs, a promotion the ring had no room
 * for), the most urgent first, by the index's order (priority, fair key, id).
 */
static PgjqPlan plan_promote_ready_pick = {
	"SELECT j.id, j.xmin, j.queue_id, j.priority, j.fair_key FROM pgjq.job j"
	" WHERE j.queue_id = $1 AND j.state = 'r'"
	" ORDER BY j.priority, j.fair_key, j.id LIMIT $2"
	"   FOR UPDATE SKIP LOCKED",
	2, {INT4OID, INT4OID}, NULL, true
};

/*
 * A claim of a ring queue whose pgjq.job may hold ready rows moves up to
 * limit of them into the ring first (as this transaction's own jobs: it
 * takes them after the committed ones, and they are everyone's at its
 * commit).  Returns how many; *left is set when rows may remain.
 */
int64
pgjq_ring_promote_ready(int32 queue_id, int limit, bool *left)
{
	Datum		values[2];
	int			room;
	int64		n;
	uint64		picked;

	*left = true;
	if (ring == NULL || limit <= 0 || !ring_ensure_ready(false))
		return 0;
	room = promote_room(limit);
	if (room <= 0)
		return 0;
	values[0] = Int32GetDatum(queue_id);
	values[1] = Int32GetDatum(room);
	pgjq_spi_run(&plan_promote_ready_pick, values, NULL, 0);
	picked = SPI_processed;
	/* rows may remain: the limit was reached, or in-flight ones skipped */
	*left = picked == (uint64) room;
	if (picked == 0)
		return 0;
	n = promote_picked();
	if (n < (int64) picked)
		*left = true;
	/* promoted here and rolled back: ready in pgjq.job again */
	ring_note_table_touch(queue_id, false);
	return n;
}

/*
 * Due jobs of this database that promotions left in pgjq.job because the
 * ring had no room for their queue, lane or priority since the server
 * started: how many, the latest time, and the bound then (NULL: none).
 */
void
pgjq_ring_refusals(int64 *n, TimestampTz *at, const char **bound)
{
	RingDb	   *db;

	*n = 0;
	*at = 0;
	*bound = NULL;
	if (ring == NULL)
		return;
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	if (db != NULL && db->refused > 0)
	{
		*n = db->refused;
		*at = db->refused_at;
		*bound = refused_names[db->refused_bound];
	}
	LWLockRelease(ring->lock);
}
