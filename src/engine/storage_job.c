/*-------------------------------------------------------------------------
 *
 * storage_job.c
 *	  Rows of pgjq.job: enqueue of delayed jobs (and of a backlog the ring
 *	  has no room for), dedup anchors, cancel of a waiting job, redrive.
 *
 * pgjq.job holds the jobs that are not in the ring (ring.h): state 's'
 * scheduled (delayed, or a retry or snooze until due) and 'r' ready (until
 * a claim moves them into the ring), and the anchors ('n') of ring jobs
 * with a dedup_key, which hold the key in the unique index.  Cancelling a
 * waiting job moves it to pgjq.job_history in the same statement (DELETE
 * ... RETURNING feeding INSERT).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/storage_internal.h"
#include "state/limits.h"
#include "state/wait.h"

#include "commands/sequence.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#define HISTORY_COLUMNS \
	"INSERT INTO pgjq.job_history (id, queue_id, state, priority, fair_key, dedup_key," \
	" attempt, max_attempts, token, enqueued_at, finished_at, worker, last_error, payload," \
	" timeout) "

/* RETURNING of a finishing statement: state, then what report_left_running() reads */
#define HISTORY_FROM_D(state, finished, error, payload) \
	HISTORY_COLUMNS \
	"SELECT d.id, d.queue_id, " state ", d.priority, d.fair_key, d.dedup_key," \
	" d.attempt, d.max_attempts, d.token, d.enqueued_at, " finished ", d.worker, " \
	error ", " payload ", d.timeout FROM d RETURNING state, queue_id, fair_key"

/*
 * Each insert comes in two forms: with ON CONFLICT for jobs with a dedup_key,
 * and without when none has one (speculative insertion costs an extra WAL
 * record per row).
 */
#define ENQUEUE_ONE \
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt," \
	" max_attempts, token, enqueued_at, run_at, cancel_requested, payload, timeout, dedup_scope)" \
	" VALUES ($1, $2, $3, $4, COALESCE($5, ''), $6, 0, $7, 0, $8, $9, false, $10, $11, $12)"
#define ENQUEUE_ONE_TYPES \
	12, {INT8OID, INT4OID, CHAROID, INT2OID, TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID, \
	TIMESTAMPTZOID, JSONBOID, INTERVALOID, CHAROID}
#define ENQUEUE_MANY \
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt," \
	" max_attempts, token, enqueued_at, run_at, cancel_requested, payload, timeout, dedup_scope)" \
	" SELECT t.id, $1, $2, $3, COALESCE(t.fair_key, ''), t.dedup_key, 0, $4, 0, $5, $6, false," \
	"        t.payload, $11, CASE WHEN t.dedup_key IS NOT NULL THEN $12 END" \
	"   FROM unnest($7::int8[], $8::jsonb[], $9::text[], $10::text[])" \
	"        AS t(id, payload, fair_key, dedup_key)"
#define ENQUEUE_MANY_TYPES \
	12, {INT4OID, CHAROID, INT2OID, INT4OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8ARRAYOID, \
	JSONBARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INTERVALOID, CHAROID}
#define ON_DEDUP_CONFLICT \
	" ON CONFLICT (queue_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"

static PgjqPlan plan_enqueue_one = {ENQUEUE_ONE, ENQUEUE_ONE_TYPES};
static PgjqPlan plan_enqueue_one_dedup = {ENQUEUE_ONE ON_DEDUP_CONFLICT, ENQUEUE_ONE_TYPES};
static PgjqPlan plan_enqueue_many = {ENQUEUE_MANY " RETURNING id", ENQUEUE_MANY_TYPES};
static PgjqPlan plan_enqueue_many_dedup = {ENQUEUE_MANY ON_DEDUP_CONFLICT " RETURNING id",
ENQUEUE_MANY_TYPES};

static PgjqPlan plan_dedup_lookup = {
	"SELECT t.ord, j.id"
	"  FROM unnest($2::text[]) WITH ORDINALITY AS t(k, ord)"
	"  JOIN pgjq.job j ON j.queue_id = $1 AND j.dedup_key = t.k",
	2, {INT4OID, TEXTARRAYOID}, NULL, true
};

static PgjqPlan plan_cancel_waiting = {
	"WITH d AS (DELETE FROM pgjq.job j WHERE j.id = $1 AND j.state IN ('s', 'r', 'w')"
	"           RETURNING j.*) "
	HISTORY_FROM_D("'x'", "$2", "d.last_error", "NULL"),
	2, {INT8OID, TIMESTAMPTZOID}, NULL, true
};

/* a waiting job whose dependency ended dead or cancelled (deps.c) */
static PgjqPlan plan_cancel_dependent = {
	"WITH d AS (DELETE FROM pgjq.job j WHERE j.id = $1 AND j.state = 'w'"
	"           RETURNING j.*) "
	HISTORY_FROM_D("'x'", "$2", "$3", "NULL"),
	3, {INT8OID, TIMESTAMPTZOID, TEXTOID}, NULL, true
};

/*
 * Of dead jobs sharing a dedup_key only the newest is redriven, and none
 * whose key an unfinished job holds: the unique index stays satisfied.  The
 * NOT EXISTS test uses the statement's snapshot, so an unfinished job with
 * the key can still appear concurrently (an uncommitted enqueue, another
 * retry_dead): ON CONFLICT then skips the job and kept puts its history row
 * back, so it stays dead instead of the whole call failing.
 */
static PgjqPlan plan_retry_dead = {
	"WITH c AS (SELECT h.id FROM pgjq.job_history h"
	"            WHERE h.queue_id = $1 AND h.state = 'd' AND h.dedup_key IS NULL"
	"              AND ($2::int8[] IS NULL OR h.id = ANY ($2))"
	"           UNION ALL"
	"           SELECT * FROM (SELECT DISTINCT ON (h.dedup_key) h.id FROM pgjq.job_history h"
	"                          WHERE h.queue_id = $1 AND h.state = 'd'"
	"                            AND h.dedup_key IS NOT NULL"
	"                            AND ($2::int8[] IS NULL OR h.id = ANY ($2))"
	"                            AND NOT EXISTS (SELECT 1 FROM pgjq.job j"
	"                                             WHERE j.queue_id = h.queue_id"
	"                                               AND j.dedup_key = h.dedup_key)"
	"                          ORDER BY h.dedup_key, h.id DESC) k),"
	" d AS (DELETE FROM pgjq.job_history h USING c"
	"        WHERE h.id = c.id AND h.queue_id = $1 AND h.state = 'd'"
	"       RETURNING h.*),"
	" r AS (INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	"        max_attempts, token, enqueued_at, run_at, worker, last_error, cancel_requested,"
	"        payload, timeout)"
	" SELECT d.id, d.queue_id, 'r', d.priority, d.fair_key, d.dedup_key, 0, d.max_attempts,"
	"        d.token, d.enqueued_at, $3, d.worker, d.last_error, false,"
	"        COALESCE(d.payload, '{}'), d.timeout"
	"   FROM d"
	" ON CONFLICT (queue_id, dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"
	" RETURNING id, queue_id),"
	" kept AS (INSERT INTO pgjq.job_history"
	"       SELECT d.* FROM d WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.id = d.id))"
	" SELECT queue_id FROM r",
	3, {INT4OID, INT8ARRAYOID, TIMESTAMPTZOID}, NULL, true
};

/*
 * Tell the jobs-finished hook about the rows of the last statement, whose
 * columns col and col + 1 are the final state and queue_id (one job per row).
 */
static void
report_finished_at(int col)
{
	if (pgjq_jobs_finished_hook == NULL)
		return;
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool		isnull;

		pgjq_jobs_finished_hook(DatumGetInt32(pgjq_spi_get(r, col + 1, &isnull)),
								DatumGetChar(pgjq_spi_get(r, col, &isnull)), 1);
	}
}

static int64
next_value(const char *seqname)
{
	Oid			seq = pgjq_relation(seqname);

	if (!OidIsValid(seq))
		elog(ERROR, "pgjq: sequence pgjq.%s is missing", seqname);
	return nextval_internal(seq, false);
}

int64
pgjq_storage_next_token(void)
{
	return next_value("token_seq");
}

int64
pgjq_storage_next_job_id(void)
{
	return next_value("job_id_seq");
}

static ArrayType *
datum_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return construct_md_array(values, nulls, 1, dims, lbs, elemtype, typlen, typbyval, typalign);
}

/* Position of id in the ascending array ids[0..n), or -1. */
static int
find_id(const int64 *ids, int n, int64 id)
{
	int			lo = 0,
				hi = n - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;

		if (ids[mid] == id)
			return mid;
		if (ids[mid] < id)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

/*
 * Insert the jobs (pending positions only) and return how many positions are
 * still unresolved: a dedup_key conflicted and the existing job has finished
 * since, so the caller tries again.
 */
static int
enqueue_round(int32 queue_id, PgjqNewJobs *jobs, int *pending, int npending,
			  int64 *assigned, bool *resolved)
{
	char		state = jobs->anchors ? 'n' : jobs->run_at > jobs->enqueued_at ? 's' : 'r';
	int			nleft = 0;
	Datum		empty = jobs->anchors ? DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")) : (Datum) 0;

	if (npending == 1)
	{
		int			i = pending[0];
		Datum		values[12];
		char		nulls[13] = "            ";

		values[0] = Int64GetDatum(assigned[i]);
		values[1] = Int32GetDatum(queue_id);
		values[2] = CharGetDatum(state);
		values[3] = Int16GetDatum(jobs->priority);
		if (jobs->fair_keys && !jobs->fair_key_nulls[i])
			values[4] = jobs->fair_keys[i];
		else
			nulls[4] = 'n';
		if (jobs->dedup_keys && !jobs->dedup_key_nulls[i])
			values[5] = jobs->dedup_keys[i];
		else
			nulls[5] = 'n';
		values[6] = Int32GetDatum(jobs->max_attempts);
		values[7] = TimestampTzGetDatum(jobs->enqueued_at);
		values[8] = TimestampTzGetDatum(jobs->run_at > jobs->enqueued_at ? jobs->run_at : jobs->enqueued_at);
		values[9] = jobs->anchors ? empty : jobs->payloads[i];
		values[10] = jobs->timeout_us > 0 ? pgjq_interval_datum(jobs->timeout_us) : (Datum) 0;
		if (jobs->timeout_us <= 0)
			nulls[10] = 'n';
		values[11] = CharGetDatum(jobs->dedup_scope);
		if (jobs->dedup_scope == 0 || nulls[5] == 'n')
			nulls[11] = 'n';
		pgjq_spi_run(nulls[5] == 'n' ? &plan_enqueue_one : &plan_enqueue_one_dedup,
					 values, nulls, 0);
		if (SPI_processed == 1)
		{
			jobs->ids[i] = assigned[i];
			resolved[i] = true;
			if (jobs->created)
				jobs->created[i] = true;
		}
	}
	else
	{
		Datum	   *ids = palloc(sizeof(Datum) * npending);
		Datum	   *payloads = palloc(sizeof(Datum) * npending);
		Datum	   *fks = palloc(sizeof(Datum) * npending);
		bool	   *fknulls = palloc(sizeof(bool) * npending);
		Datum	   *dks = palloc(sizeof(Datum) * npending);
		bool	   *dknulls = palloc(sizeof(bool) * npending);
		int64	   *sorted = palloc(sizeof(int64) * npending);
		Datum		values[12];
		char		nulls[13] = "            ";
		bool		any_dedup = false;

		for (int k = 0; k < npending; k++)
		{
			int			i = pending[k];

			ids[k] = Int64GetDatum(assigned[i]);
			sorted[k] = assigned[i];
			payloads[k] = jobs->anchors ? empty : jobs->payloads[i];
			fknulls[k] = !jobs->fair_keys || jobs->fair_key_nulls[i];
			fks[k] = fknulls[k] ? (Datum) 0 : jobs->fair_keys[i];
			dknulls[k] = !jobs->dedup_keys || jobs->dedup_key_nulls[i];
			dks[k] = dknulls[k] ? (Datum) 0 : jobs->dedup_keys[i];
			any_dedup |= !dknulls[k];
		}
		values[0] = Int32GetDatum(queue_id);
		values[1] = CharGetDatum(state);
		values[2] = Int16GetDatum(jobs->priority);
		values[3] = Int32GetDatum(jobs->max_attempts);
		values[4] = TimestampTzGetDatum(jobs->enqueued_at);
		values[5] = TimestampTzGetDatum(jobs->run_at > jobs->enqueued_at ? jobs->run_at : jobs->enqueued_at);
		values[6] = PointerGetDatum(datum_array(ids, NULL, npending, INT8OID));
		values[7] = PointerGetDatum(datum_array(payloads, NULL, npending, JSONBOID));
		values[8] = PointerGetDatum(datum_array(fks, fknulls, npending, TEXTOID));
		values[9] = PointerGetDatum(datum_array(dks, dknulls, npending, TEXTOID));
		values[10] = jobs->timeout_us > 0 ? pgjq_interval_datum(jobs->timeout_us) : (Datum) 0;
		if (jobs->timeout_us <= 0)
			nulls[10] = 'n';
		values[11] = CharGetDatum(jobs->dedup_scope);
		if (jobs->dedup_scope == 0)
			nulls[11] = 'n';
		pgjq_spi_run(any_dedup ? &plan_enqueue_many_dedup : &plan_enqueue_many, values, nulls, 0);

		/* assigned ids ascend with position (one nextval each, in order) */
		for (uint64 r = 0; r < SPI_processed; r++)
		{
			int64		id = pgjq_spi_get_int64(r, 1);
			int			k = find_id(sorted, npending, id);

			if (k < 0)
				elog(ERROR, "pgjq: enqueue returned an unknown id " INT64_FORMAT, id);
			jobs->ids[pending[k]] = id;
			resolved[pending[k]] = true;
			if (jobs->created)
				jobs->created[pending[k]] = true;
		}
	}

	/* Positions not inserted conflicted on dedup_key: find the existing job. */
	{
		int		   *lookup = palloc(sizeof(int) * npending);
		Datum	   *keys = palloc(sizeof(Datum) * npending);
		int			nlookup = 0;

		for (int k = 0; k < npending; k++)
		{
			int			i = pending[k];

			if (resolved[i])
				continue;
			Assert(jobs->dedup_keys && !jobs->dedup_key_nulls[i]);
			lookup[nlookup] = i;
			keys[nlookup++] = jobs->dedup_keys[i];
		}
		if (nlookup > 0)
		{
			Datum		values[2];

			values[0] = Int32GetDatum(queue_id);
			values[1] = PointerGetDatum(datum_array(keys, NULL, nlookup, TEXTOID));
			pgjq_spi_run(&plan_dedup_lookup, values, NULL, 0);
			for (uint64 r = 0; r < SPI_processed; r++)
			{
				int64		ord = pgjq_spi_get_int64(r, 1);
				int			i = lookup[ord - 1];

				jobs->ids[i] = pgjq_spi_get_int64(r, 2);
				resolved[i] = true;
			}
			/* retry the ones whose existing job finished in between */
			for (int k = 0; k < nlookup; k++)
				if (!resolved[lookup[k]])
					pending[nleft++] = lookup[k];
		}
	}
	return nleft;
}

/*
 * Insert jobs->n jobs of one queue; ids come back in input order.  A job
 * whose dedup_key matches an unfinished job of the queue is not inserted and
 * gets that job's id; a duplicate within the same call gets the first one's.
 */
void
pgjq_storage_enqueue(int32 queue_id, PgjqNewJobs *jobs)
{
	int64	   *assigned = palloc(sizeof(int64) * jobs->n);
	bool	   *resolved = palloc0(sizeof(bool) * jobs->n);
	int		   *pending = palloc(sizeof(int) * jobs->n);
	int			npending = jobs->n;

	for (int i = 0; i < jobs->n; i++)
	{
		assigned[i] = jobs->ids_given ? jobs->ids[i] : next_value("job_id_seq");
		pending[i] = i;
	}
	while (npending > 0)
	{
		CHECK_FOR_INTERRUPTS();
		npending = enqueue_round(queue_id, jobs, pending, npending, assigned, resolved);
	}
	if (pgjq_became_ready_hook && jobs->run_at <= jobs->enqueued_at && !jobs->anchors)
		pgjq_became_ready_hook(queue_id, jobs->n);
}

PgjqCancelResult
pgjq_storage_cancel(int64 id, TimestampTz now)
{
	Datum		values[2] = {Int64GetDatum(id), TimestampTzGetDatum(now)};

	pgjq_history_ensure(now);
	pgjq_spi_run(&plan_cancel_waiting, values, NULL, 0);
	if (SPI_processed > 0)
	{
		report_finished_at(1);
		pgjq_wait_note_finished(id, PGJQ_FINISHED_CANCELLED);
		return PGJQ_CANCEL_DONE;
	}
	return PGJQ_CANCEL_NOT_FOUND;
}

/* Cancel waiting job id, with `reason` as its last_error; false if it is not waiting. */
bool
pgjq_storage_cancel_waiting(int64 id, const char *reason, TimestampTz now)
{
	Datum		values[3] = {Int64GetDatum(id), TimestampTzGetDatum(now),
	CStringGetTextDatum(reason)};

	pgjq_history_ensure(now);
	pgjq_spi_run(&plan_cancel_dependent, values, NULL, 0);
	if (SPI_processed == 0)
		return false;
	report_finished_at(1);
	pgjq_wait_note_finished(id, PGJQ_FINISHED_CANCELLED);
	return true;
}

/*
 * The ids that may be unfinished jobs of (queue, fair_key), for cancel_key:
 * pgjq.job's rows (by its ready and scheduled indexes' leading column) and
 * the live ring's bodies (a scan of the ring: finished ones are among them,
 * and cancel finds nothing to do for those).  Sorted, no duplicates.
 */
static PgjqPlan plan_key_jobs = {
	"SELECT id FROM pgjq.job WHERE queue_id = $1 AND fair_key = $2"
	" UNION SELECT id FROM pgjq.ring_body_0 WHERE queue_id = $1 AND coalesce(fair_key, '') = $2"
	" UNION SELECT id FROM pgjq.ring_body_1 WHERE queue_id = $1 AND coalesce(fair_key, '') = $2"
	" UNION SELECT id FROM pgjq.ring_body_2 WHERE queue_id = $1 AND coalesce(fair_key, '') = $2"
	" UNION SELECT id FROM pgjq.ring_body_3 WHERE queue_id = $1 AND coalesce(fair_key, '') = $2"
	" ORDER BY 1",
	2, {INT4OID, TEXTOID}, NULL, true
};

int
pgjq_storage_key_jobs(int32 queue_id, const char *fair_key, int64 **ids)
{
	Datum		values[2] = {Int32GetDatum(queue_id), CStringGetTextDatum(fair_key)};
	int			n;

	pgjq_spi_run(&plan_key_jobs, values, NULL, 0);
	n = (int) SPI_processed;
	*ids = MemoryContextAlloc(pgjq_result_cxt, sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		(*ids)[i] = pgjq_spi_get_int64(i, 1);
	return n;
}

/*
 * Make dead jobs of a queue (all, or those in ids) ready again with their
 * attempts reset.  A dead job whose dedup_key is held by an unfinished job
 * stays dead.
 */
int64
pgjq_storage_retry_dead(int32 queue_id, ArrayType *ids, TimestampTz now)
{
	Datum		values[3];
	char		nulls[4] = "   ";

	values[0] = Int32GetDatum(queue_id);
	if (ids)
		values[1] = PointerGetDatum(ids);
	else
		nulls[1] = 'n';
	values[2] = TimestampTzGetDatum(now);
	pgjq_spi_run(&plan_retry_dead, values, nulls, 0);
	if (pgjq_became_ready_hook && SPI_processed > 0)
		pgjq_became_ready_hook(queue_id, (int) Min(SPI_processed, PG_INT32_MAX));
	return (int64) SPI_processed;
}

/*
 * Whether this node holds job id, in any state job(id) shows: a row of
 * pgjq.job (scheduled, ready outside the ring, waiting), a body in the
 * ring's tables (ready or running in the ring, or finished there lately), a
 * row of pgjq.job_history (dead, cancelled) or of pgjq.job_done
 * (completed).  Read with the latest snapshot, in its own SPI session.  For
 * the Citus id guard, and only on its refusing path: a job that a move
 * carried here keeps the id that another node issued (the history tables
 * have no index by id: this is not for a hot path).  The ring's bodies are
 * its four slot tables, as sql/pgjq.sql makes them (RING_NSLOTS).
 */
bool
pgjq_storage_job_here(int64 id)
{
	static PgjqPlan plan_here = {
		"SELECT EXISTS (SELECT 1 FROM pgjq.job WHERE id = $1 AND state <> 'n')"
		"    OR EXISTS (SELECT 1 FROM pgjq.ring_body_0 WHERE id = $1)"
		"    OR EXISTS (SELECT 1 FROM pgjq.ring_body_1 WHERE id = $1)"
		"    OR EXISTS (SELECT 1 FROM pgjq.ring_body_2 WHERE id = $1)"
		"    OR EXISTS (SELECT 1 FROM pgjq.ring_body_3 WHERE id = $1)"
		"    OR EXISTS (SELECT 1 FROM pgjq.job_history WHERE id = $1)"
		"    OR EXISTS (SELECT 1 FROM pgjq.job_done d"
		"                WHERE d.min_id <= $1 AND d.max_id >= $1 AND $1 = ANY (d.ids))",
		1, {INT8OID}
	};
	Datum		v[1] = {Int64GetDatum(id)};
	bool		isnull;
	bool		here;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	pgjq_spi_run_latest(&plan_here, v, NULL, 1);
	here = SPI_processed == 1 && DatumGetBool(pgjq_spi_get(0, 1, &isnull)) && !isnull;
	SPI_finish();
	return here;
}
