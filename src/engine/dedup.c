/*-------------------------------------------------------------------------
 *
 * dedup.c
 *	  enqueue's dedup options: dedup_scope, dedup_for, on_duplicate and
 *	  debounce_max.
 *
 * A dedup_key is held by the job that took it, and a duplicate (an enqueue
 * of the same queue and key while it is held) gets that job's id instead of
 * a new job.  How long the key is held:
 *
 *	 'unfinished' (the default): until the job ends, by the unique index of
 *		pgjq.job (the job's own row while it waits there, its anchor row 'n'
 *		while it is in the ring; ring_enqueue.c).
 *	 'waiting': the same, but only until the job is claimed: the claim
 *		deletes the anchor (the body says so, dedup_scope 'w'), so a new job
 *		may be enqueued while one runs.  A retry of a job that was claimed
 *		does not take the key back.
 *	 dedup_for => interval: for that long from the enqueue, whatever becomes
 *		of the job, by a row of pgjq.dedup_period (the job itself has no
 *		dedup_key).  An enqueue takes over a row that ended; the worker's
 *		prune deletes them.
 *
 * on_duplicate => 'replace' (debounce): a duplicate whose holder still
 * waits (scheduled, or ready and not claimed) replaces the holder's
 * payload and moves its run_at to the duplicate's due time, at most
 * debounce_max after the holder's enqueue, so that a stream of duplicates
 * cannot postpone it forever.  A holder that runs (or, for dedup_for, has
 * ended) is left as it is.  A ready ring job cannot be changed in place:
 * it is taken out of its lane as cancel takes it, and its next version
 * waits in pgjq.job (ring_take.c, pgjq_ring_replace_ready).
 *
 * Races: replace and dedup_for go position by position.  The holder is found
 * and locked first (its pgjq.job row, or its dedup_period row), so two
 * replacing enqueues of one key take turns; when there is none, the insert
 * decides (ON CONFLICT), and a position that lost to a concurrent enqueue
 * goes round again and finds that one's job.  Without these options
 * enqueue stays one statement for the whole call.
 *
 *-------------------------------------------------------------------------
 */
#include "common/args.h"
#include "engine/ring.h"
#include "common/spi_plans.h"
#include "engine/engine.h"
#include "state/worker_slots.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#define MAX_DEDUP_US	(INT64CONST(3650) * USECS_PER_DAY)

/* the job holding a key of 'unfinished' or 'waiting' scope, locked */
static PgjqPlan plan_holder = {
	"SELECT id, state, enqueued_at FROM pgjq.job"
	" WHERE queue_id = $1 AND dedup_key = $2 FOR UPDATE",
	2, {INT4OID, TEXTOID}, NULL, true
};

/* a dedup_for holder's row in pgjq.job, if it waits there, locked */
static PgjqPlan plan_job_row = {
	"SELECT id, state, enqueued_at FROM pgjq.job WHERE id = $1 FOR UPDATE",
	1, {INT8OID}, NULL, true
};

static PgjqPlan plan_replace_row = {
	"UPDATE pgjq.job SET payload = $2, run_at = $3, state = $4 WHERE id = $1",
	4, {INT8OID, JSONBOID, TIMESTAMPTZOID, CHAROID}, NULL, true
};

/* the job holding a dedup_for key, locked (one whose period ended holds none) */
static PgjqPlan plan_period_holder = {
	"SELECT job_id FROM pgjq.dedup_period"
	" WHERE queue_id = $1 AND dedup_key = $2 AND until > $3 FOR UPDATE",
	3, {INT4OID, TEXTOID, TIMESTAMPTZOID}
};

/* the key for a new job: a row, or one whose period ended; none if held */
static PgjqPlan plan_period_take = {
	"INSERT INTO pgjq.dedup_period AS p (queue_id, dedup_key, job_id, until)"
	" VALUES ($1, $2, $3, $4)"
	" ON CONFLICT (queue_id, dedup_key) DO UPDATE SET job_id = excluded.job_id,"
	"                                                 until = excluded.until"
	"   WHERE p.until <= $5 RETURNING job_id",
	5, {INT4OID, TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static PgjqPlan plan_period_prune = {
	"DELETE FROM pgjq.dedup_period WHERE ctid = ANY (ARRAY("
	"  SELECT ctid FROM pgjq.dedup_period WHERE until <= $1 LIMIT $2))",
	2, {TIMESTAMPTZOID, INT4OID}
};

static const char *
text_arg(FunctionCallInfo fcinfo, int argno)
{
	if (argno >= PG_NARGS() || PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

void
pgjq_dedup_args(FunctionCallInfo fcinfo, int argno, bool keyed, const char *keys_arg,
				PgjqDedup *d)
{
	const char *scope = text_arg(fcinfo, argno);
	const char *on_duplicate = text_arg(fcinfo, argno + 2);

	memset(d, 0, sizeof(*d));
	if (scope != NULL && strcmp(scope, "waiting") == 0)
		d->scope = 'w';
	else if (scope != NULL && strcmp(scope, "unfinished") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dedup_scope must be 'unfinished' or 'waiting'"),
				 errhint("For a key held for a period from the enqueue, give dedup_for.")));
	d->for_us = pgjq_arg_interval(fcinfo, argno + 1, "dedup_for", 0, false, MAX_DEDUP_US, 0);
	if (d->for_us > 0)
	{
		if (scope != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("dedup_scope and dedup_for cannot both be given"),
					 errdetail("dedup_for holds the key for that long whatever becomes of the job.")));
		d->scope = 'p';
	}
	if (on_duplicate != NULL && strcmp(on_duplicate, "replace") == 0)
		d->replace = true;
	else if (on_duplicate != NULL && strcmp(on_duplicate, "ignore") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("on_duplicate must be 'ignore' or 'replace'")));
	d->debounce_max_us = pgjq_arg_interval(fcinfo, argno + 3, "debounce_max", 0, false,
										   MAX_DEDUP_US, 0);
	if (d->debounce_max_us > 0 && !d->replace)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("debounce_max needs on_duplicate => 'replace'")));
	if (!keyed && (scope != NULL || on_duplicate != NULL || d->for_us > 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("dedup_scope, dedup_for and on_duplicate need %s", keys_arg)));
}

/*
 * The locked holder's row of pgjq.job ('s' or 'r') takes the duplicate's
 * payload and due time (bounded by debounce_max after its enqueue).
 */
static void
replace_row(const PgjqQueue *queue, int64 id, TimestampTz enqueued_at, Datum payload,
			TimestampTz due, const PgjqDedup *d, TimestampTz now)
{
	TimestampTz run_at = due;
	char		state;
	Datum		values[4];

	if (d->debounce_max_us > 0 && enqueued_at + d->debounce_max_us < run_at)
		run_at = enqueued_at + d->debounce_max_us;
	state = run_at > now ? 's' : 'r';
	values[0] = Int64GetDatum(id);
	values[1] = payload;
	values[2] = TimestampTzGetDatum(run_at);
	values[3] = CharGetDatum(state);
	pgjq_spi_run(&plan_replace_row, values, NULL, 0);
	if (state == 'r' && pgjq_became_ready_hook)
		pgjq_became_ready_hook(queue->queue_id, 1);
	if (state == 's')
		pgjq_shmem_note_due(run_at);
}

/*
 * Replace the holder id if it still waits: its row of pgjq.job (locked by
 * the last statement when have_row: state, enqueued_at in columns 2, 3),
 * else the ready ring job.
 */
static void
replace_holder(const PgjqQueue *queue, int64 id, bool have_row, Datum payload,
			   TimestampTz due, const PgjqDedup *d, TimestampTz now)
{
	bool		isnull;
	char		state;
	TimestampTz run_at;

	if (have_row)
	{
		char		st = DatumGetChar(pgjq_spi_get(0, 2, &isnull));

		if (st != 'n')
		{
			replace_row(queue, id,
						DatumGetTimestampTz(pgjq_spi_get(0, 3, &isnull)), payload, due, d, now);
			return;
		}
	}
	/* in the ring: only while it is ready (else it runs: left as it is) */
	if (pgjq_ring_replace_ready(id, payload, due, d->debounce_max_us, now, &state, &run_at))
	{
		if (state == 'r' && pgjq_became_ready_hook)
			pgjq_became_ready_hook(queue->queue_id, 1);
		if (state == 's')
			pgjq_shmem_note_due(run_at);
	}
}

/* position i of jobs on its own, as a call of one job */
static void
store_one(const PgjqQueue *queue, PgjqNewJobs *jobs, int i, bool keyed, int64 id,
		  bool *created, PgjqStoreJobs store)
{
	PgjqNewJobs one = *jobs;
	bool		fk_null = jobs->fair_keys == NULL || jobs->fair_key_nulls[i];
	bool		dk_null = !keyed;
	Datum		fk = fk_null ? (Datum) 0 : jobs->fair_keys[i];
	Datum		dk = keyed ? jobs->dedup_keys[i] : (Datum) 0;

	one.n = 1;
	one.ids = &jobs->ids[i];
	one.payloads = &jobs->payloads[i];
	one.fair_keys = &fk;
	one.fair_key_nulls = &fk_null;
	one.dedup_keys = keyed ? &dk : NULL;
	one.dedup_key_nulls = keyed ? &dk_null : NULL;
	one.dedup_scope = keyed ? jobs->dedup_scope : 0;
	one.ids_given = !keyed;
	*created = false;
	one.created = created;
	if (!keyed)
		jobs->ids[i] = id;
	store(queue, &one);
}

/* one keyed position with replace, 'unfinished' or 'waiting' scope */
static void
store_replacing(const PgjqQueue *queue, PgjqNewJobs *jobs, int i, const PgjqDedup *d,
				TimestampTz now, PgjqStoreJobs store)
{
	Datum		values[2];

	values[0] = Int32GetDatum(queue->queue_id);
	values[1] = jobs->dedup_keys[i];
	for (;;)
	{
		bool		created;

		CHECK_FOR_INTERRUPTS();
		pgjq_spi_run(&plan_holder, values, NULL, 0);
		if (SPI_processed > 0)
		{
			jobs->ids[i] = pgjq_spi_get_int64(0, 1);
			replace_holder(queue, jobs->ids[i], true, jobs->payloads[i], jobs->run_at, d, now);
			return;
		}
		/* none: a new job, unless a concurrent enqueue's took the key since */
		store_one(queue, jobs, i, true, 0, &created, store);
		if (created)
			return;
	}
}

/* one keyed position with dedup_for */
static void
store_period(const PgjqQueue *queue, PgjqNewJobs *jobs, int i, const PgjqDedup *d,
			 TimestampTz now, PgjqStoreJobs store)
{
	for (;;)
	{
		Datum		values[5];
		int64		id;
		bool		created;

		CHECK_FOR_INTERRUPTS();
		values[0] = Int32GetDatum(queue->queue_id);
		values[1] = jobs->dedup_keys[i];
		values[2] = TimestampTzGetDatum(now);
		pgjq_spi_run(&plan_period_holder, values, NULL, 0);
		if (SPI_processed > 0)
		{
			id = pgjq_spi_get_int64(0, 1);
			jobs->ids[i] = id;
			if (d->replace)
			{
				Datum		v[1] = {Int64GetDatum(id)};

				pgjq_spi_run(&plan_job_row, v, NULL, 0);
				replace_holder(queue, id, SPI_processed > 0, jobs->payloads[i], jobs->run_at,
							   d, now);
			}
			return;
		}
		id = pgjq_storage_next_job_id();
		values[2] = Int64GetDatum(id);
		values[3] = TimestampTzGetDatum(jobs->enqueued_at + d->for_us);
		values[4] = TimestampTzGetDatum(now);
		pgjq_spi_run(&plan_period_take, values, NULL, 0);
		if (SPI_processed > 0)
		{
			/* the job itself has no dedup_key: the row holds it */
			store_one(queue, jobs, i, false, id, &created, store);
			return;
		}
		/* a concurrent enqueue took it since: its job is the holder */
	}
}

void
pgjq_dedup_store(const PgjqQueue *queue, PgjqNewJobs *jobs, const PgjqDedup *d,
				 PgjqStoreJobs store)
{
	TimestampTz now = jobs->enqueued_at;
	PgjqNewJobs rest;
	int		   *pos;
	int			m = 0;

	jobs->dedup_scope = d->scope == 'w' ? 'w' : 0;
	if (jobs->dedup_keys == NULL || (!d->replace && d->scope != 'p'))
	{
		store(queue, jobs);
		return;
	}

	/* the positions without a key together, as one call */
	pos = palloc(sizeof(int) * jobs->n);
	for (int i = 0; i < jobs->n; i++)
		if (jobs->dedup_key_nulls[i])
			pos[m++] = i;
	if (m > 0)
	{
		rest = *jobs;
		rest.n = m;
		rest.ids = palloc(sizeof(int64) * m);
		rest.payloads = palloc(sizeof(Datum) * m);
		rest.fair_keys = jobs->fair_keys ? palloc(sizeof(Datum) * m) : NULL;
		rest.fair_key_nulls = jobs->fair_keys ? palloc(sizeof(bool) * m) : NULL;
		rest.dedup_keys = NULL;
		rest.dedup_key_nulls = NULL;
		rest.created = NULL;
		for (int k = 0; k < m; k++)
		{
			rest.payloads[k] = jobs->payloads[pos[k]];
			if (jobs->fair_keys)
			{
				rest.fair_keys[k] = jobs->fair_keys[pos[k]];
				rest.fair_key_nulls[k] = jobs->fair_key_nulls[pos[k]];
			}
		}
		store(queue, &rest);
		for (int k = 0; k < m; k++)
			jobs->ids[pos[k]] = rest.ids[k];
	}
	/* then each keyed one, in order: a later duplicate replaces an earlier */
	for (int i = 0; i < jobs->n; i++)
	{
		if (jobs->dedup_key_nulls[i])
			continue;
		if (d->scope == 'p')
			store_period(queue, jobs, i, d, now, store);
		else
			store_replacing(queue, jobs, i, d, now, store);
	}
}

int64
pgjq_dedup_prune(TimestampTz now, int limit)
{
	Datum		values[2] = {TimestampTzGetDatum(now), Int32GetDatum(limit)};

	pgjq_spi_run(&plan_period_prune, values, NULL, 0);
	return (int64) SPI_processed;
}
