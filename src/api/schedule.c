/*-------------------------------------------------------------------------
 *
 * schedule.c
 *	  Periodic jobs: schedule(name, cron, queue, payload, time_zone,
 *	  catch_up), unschedule(name), and the background worker's firing of due
 *	  slots (_fire_schedules() by hand).
 *
 * A schedule is one row of pgjq.schedules with the next slot to fire.  A
 * firing transaction takes the due rows FOR UPDATE SKIP LOCKED, enqueues
 * the jobs of their due slots and moves next_slot past now, all in that one
 * transaction: a slot is enqueued exactly once, whatever crashes, restarts,
 * standby promotions or concurrent firers (another firer skips the locked
 * row, and once the first commits the row is no longer due).  Each job's
 * payload carries its slot as "pgjq_slot" (so a schedule's payload must be
 * a JSON object).
 *
 * Slots missed by downtime (more than one slot due at once) follow the
 * schedule's catch_up: 'all' enqueues each (the latest CATCH_UP_MAX of
 * them), 'one' only the latest, 'none' only a slot due less than
 * CATCH_UP_GRACE ago (the worker's own lateness).
 *
 * Who may call: pgjq_admin (a schedule enqueues into any queue).
 *
 * Under Citus a schedule whose queue is being moved away from this node is
 * held (pgjq_schedule_held_hook): not fired, its next slot kept, so that
 * the move carries it with its next slot to the queue's new node; while one
 * is held the worker looks again every second rather than at once.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "api/schedule.h"
#include "common/args.h"
#include "common/cron.h"
#include "common/spi_plans.h"
#include "engine/engine.h"
#include "state/limits.h"
#include "api/maintenance.h"
#include "state/worker_slots.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_schedule);
PG_FUNCTION_INFO_V1(pgjq_unschedule);
PG_FUNCTION_INFO_V1(pgjq_cron_slots);
PG_FUNCTION_INFO_V1(pgjq_fire_schedules);

#define CATCH_UP_MAX	1000
#define CATCH_UP_GRACE	(60 * USECS_PER_SEC)
#define FIRE_CHUNK		100
#define SCHEDULE_NAME_MAX	128

PgjqScheduleHeldHook pgjq_schedule_held_hook = NULL;

/* when this backend last held a due schedule back (0: never) */
static TimestampTz held_at = 0;

static PgjqPlan plan_upsert = {
	"INSERT INTO pgjq.schedules (name, cron, queue, payload, time_zone, catch_up, next_slot)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7)"
	" ON CONFLICT (name) DO UPDATE SET cron = excluded.cron, queue = excluded.queue,"
	"     payload = excluded.payload, time_zone = excluded.time_zone,"
	"     catch_up = excluded.catch_up, next_slot = excluded.next_slot",
	7, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, TEXTOID, TIMESTAMPTZOID}
};

static PgjqPlan plan_queue_of = {
	"SELECT queue FROM pgjq.schedules WHERE name = $1", 1, {TEXTOID}
};

static PgjqPlan plan_delete = {
	"DELETE FROM pgjq.schedules WHERE name = $1", 1, {TEXTOID}
};

static PgjqPlan plan_due = {
	"SELECT name, cron, queue, payload, time_zone, catch_up, next_slot FROM pgjq.schedules"
	" WHERE next_slot <= $1 ORDER BY next_slot LIMIT $2 FOR UPDATE SKIP LOCKED",
	2, {TIMESTAMPTZOID, INT4OID}
};

static PgjqPlan plan_enqueue = {
	"SELECT pgjq.enqueue($1, $2 || jsonb_build_object('pgjq_slot', $3::timestamptz))",
	3, {TEXTOID, JSONBOID, TIMESTAMPTZOID}
};

static PgjqPlan plan_advance = {
	"UPDATE pgjq.schedules SET next_slot = $2, last_slot = coalesce($3, last_slot)"
	" WHERE name = $1",
	3, {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

static PgjqPlan plan_next = {
	"SELECT min(next_slot) FROM pgjq.schedules", 0, {0}
};

static char *
catch_up_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *v = PG_ARGISNULL(argno) ? "one" : text_to_cstring(PG_GETARG_TEXT_PP(argno));

	if (strcmp(v, "none") != 0 && strcmp(v, "one") != 0 && strcmp(v, "all") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("catch_up must be 'none', 'one' or 'all', not \"%s\"", v)));
	return v;
}

/*
 * pgjq.schedule(name, cron, queue, payload, time_zone, catch_up): create or
 * replace a schedule; returns its first slot.
 */
Datum
pgjq_schedule(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *expr;
	char	   *queue_name;
	Datum		payload;
	char	   *zone;
	char	   *catch_up;
	PgjqCron	cron;
	pg_tz	   *tz;
	TimestampTz first;
	PgjqQueue	queue;
	Datum		values[7];

	pgjq_arg_not_null(fcinfo, 0, "name");
	name = pgjq_arg_text(fcinfo, 0, "name", SCHEDULE_NAME_MAX);
	if (name[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("name must not be empty")));
	pgjq_arg_not_null(fcinfo, 1, "cron");
	expr = text_to_cstring(PG_GETARG_TEXT_PP(1));
	queue_name = pgjq_arg_queue_name(fcinfo, 2);
	pgjq_arg_not_null(fcinfo, 3, "payload");
	payload = PG_GETARG_DATUM(3);
	if (!JB_ROOT_IS_OBJECT(DatumGetJsonbP(payload)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("payload must be a JSON object"),
				 errdetail("Each job gets its slot in the payload, as \"pgjq_slot\".")));
	pgjq_check_payload(payload, "payload");
	pgjq_arg_not_null(fcinfo, 4, "time_zone");
	zone = text_to_cstring(PG_GETARG_TEXT_PP(4));
	catch_up = catch_up_arg(fcinfo, 5);

	pgjq_cron_parse(expr, &cron);
	tz = pgjq_cron_zone(zone, "time_zone");
	first = pgjq_cron_next(&cron, tz, GetCurrentTimestamp());
	if (TIMESTAMP_IS_NOEND(first))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("cron expression \"%s\" never fires", expr),
				 errdetail("It matches no time in the next five years.")));

	pgjq_guard_queue(queue_name, PGJQ_GUARD_ALTER);
	pgjq_storage_begin();
	pgjq_storage_queue_get_or_error(queue_name, &queue);
	values[0] = CStringGetTextDatum(name);
	values[1] = CStringGetTextDatum(expr);
	values[2] = CStringGetTextDatum(queue_name);
	values[3] = payload;
	values[4] = CStringGetTextDatum(zone);
	values[5] = CStringGetTextDatum(catch_up);
	values[6] = TimestampTzGetDatum(first);
	pgjq_spi_run(&plan_upsert, values, NULL, 0);
	pgjq_storage_end();
	/* the worker sleeps until its next deadline: this may be sooner */
	pgjq_shmem_note_due(first);
	PG_RETURN_TIMESTAMPTZ(first);
}

Datum
pgjq_unschedule(PG_FUNCTION_ARGS)
{
	char	   *name;
	Datum		values[1];
	bool		found;

	pgjq_arg_not_null(fcinfo, 0, "name");
	name = pgjq_arg_text(fcinfo, 0, "name", SCHEDULE_NAME_MAX);
	values[0] = CStringGetTextDatum(name);
	pgjq_storage_begin();
	/* under Citus: not on the source of a move (its schedules move with it) */
	if (pgjq_guard_active())
	{
		pgjq_spi_run(&plan_queue_of, values, NULL, 1);
		if (SPI_processed == 1)
			pgjq_guard_queue(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1),
							 PGJQ_GUARD_UNSCHEDULE);
	}
	pgjq_spi_run(&plan_delete, values, NULL, 0);
	found = SPI_processed > 0;
	pgjq_storage_end();
	PG_RETURN_BOOL(found);
}

/* pgjq._cron_slots(cron, time_zone, after, n): the next n slots after `after`. */
Datum
pgjq_cron_slots(PG_FUNCTION_ARGS)
{
	char	   *expr;
	char	   *zone;
	TimestampTz t;
	int32		n;
	PgjqCron	cron;
	pg_tz	   *tz;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	for (int i = 0; i < 4; i++)
		pgjq_arg_not_null(fcinfo, i, i == 0 ? "cron" : i == 1 ? "time_zone" : i == 2 ? "after" : "n");
	expr = text_to_cstring(PG_GETARG_TEXT_PP(0));
	zone = text_to_cstring(PG_GETARG_TEXT_PP(1));
	t = PG_GETARG_TIMESTAMPTZ(2);
	n = PG_GETARG_INT32(3);
	if (n < 0 || n > 10000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("n must be between 0 and 10000")));
	pgjq_cron_parse(expr, &cron);
	tz = pgjq_cron_zone(zone, "time_zone");
	pgjq_srf_materialize(fcinfo);
	for (int i = 0; i < n; i++)
	{
		Datum		v;
		bool		isnull = false;

		t = pgjq_cron_next(&cron, tz, t);
		if (TIMESTAMP_IS_NOEND(t))
			break;
		v = TimestampTzGetDatum(t);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &v, &isnull);
	}
	return (Datum) 0;
}

/*
 * Fire one due schedule (its row locked): enqueue the slots catch_up picks
 * among those due, move next_slot past now.  Returns the jobs enqueued, or
 * -1 for a schedule held by a move (pgjq_schedule_held_hook): left as it is.
 */
static int64
fire_one(HeapTuple row, TupleDesc desc, TimestampTz now)
{
	bool		isnull;
	char	   *name = TextDatumGetCString(SPI_getbinval(row, desc, 1, &isnull));
	char	   *expr = TextDatumGetCString(SPI_getbinval(row, desc, 2, &isnull));
	char	   *queue_name = TextDatumGetCString(SPI_getbinval(row, desc, 3, &isnull));
	Datum		payload = datumCopy(SPI_getbinval(row, desc, 4, &isnull), false, -1);
	char	   *zone = TextDatumGetCString(SPI_getbinval(row, desc, 5, &isnull));
	char	   *catch_up = TextDatumGetCString(SPI_getbinval(row, desc, 6, &isnull));
	TimestampTz s = DatumGetTimestampTz(SPI_getbinval(row, desc, 7, &isnull));
	TimestampTz *keep = palloc(sizeof(TimestampTz) * CATCH_UP_MAX);
	int64		due = 0;
	int			nkeep = 0;
	int			first = 0;		/* keep[] is a ring of the latest due slots */
	int64		fired = 0;
	TimestampTz last = 0;
	PgjqCron	cron;
	pg_tz	   *tz;
	PgjqQueue	queue;
	Datum		values[3];
	char		nulls[3] = "   ";

	if (pgjq_schedule_held_hook != NULL && pgjq_schedule_held_hook(queue_name))
	{
		held_at = GetCurrentTimestamp();
		return -1;
	}
	pgjq_cron_parse(expr, &cron);
	tz = pgjq_cron_zone(zone, "time_zone");
	while (s <= now)
	{
		CHECK_FOR_INTERRUPTS();
		if (nkeep < CATCH_UP_MAX)
			keep[nkeep++] = s;
		else
		{
			keep[first] = s;
			first = (first + 1) % CATCH_UP_MAX;
		}
		due++;
		s = pgjq_cron_next(&cron, tz, s);
	}
	if (!pgjq_storage_queue_get(queue_name, &queue))
		ereport(WARNING,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("pgjq: schedule \"%s\": queue \"%s\" does not exist; " INT64_FORMAT " slot(s) skipped",
						name, queue_name, due)));
	else
	{
		for (int i = 0; i < nkeep; i++)
		{
			TimestampTz slot = keep[(first + i) % nkeep];
			bool		latest = i == nkeep - 1;

			if (strcmp(catch_up, "all") != 0 && !latest)
				continue;
			if (strcmp(catch_up, "none") == 0 && now - slot >= CATCH_UP_GRACE)
				continue;
			values[0] = CStringGetTextDatum(queue_name);
			values[1] = payload;
			values[2] = TimestampTzGetDatum(slot);
			pgjq_spi_run(&plan_enqueue, values, NULL, 1);
			fired++;
			last = slot;
		}
		if (due > fired)
			ereport(LOG,
					(errmsg("pgjq: schedule \"%s\": " INT64_FORMAT " missed slot(s) skipped (catch_up '%s')",
							name, due - fired, catch_up)));
	}
	values[0] = CStringGetTextDatum(name);
	values[1] = TimestampTzGetDatum(s);
	values[2] = TimestampTzGetDatum(last);
	nulls[2] = last == 0 ? 'n' : ' ';
	pgjq_spi_run(&plan_advance, values, nulls, 0);
	return fired;
}

/*
 * Fire up to `limit` due schedules in the caller's transaction; returns how
 * many schedules were due (the worker's chunk count).
 */
static int64
fire_due(int limit, int64 *jobs)
{
	/*
	 * due as of the transaction's start: now() (the worker starts one per
	 * step)
	 */
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	Datum		values[2] = {TimestampTzGetDatum(now), Int32GetDatum(limit)};
	SPITupleTable *rows;
	uint64		n;
	uint64		held = 0;

	*jobs = 0;
	if (RecoveryInProgress())
		return 0;
	pgjq_storage_begin();
	pgjq_spi_run(&plan_due, values, NULL, 0);
	rows = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		int64		fired = fire_one(rows->vals[i], rows->tupdesc, now);

		/* a held schedule (-1) counts as not due: no chunk after it for it */
		if (fired < 0)
			held++;
		else
			*jobs += fired;
	}
	pgjq_storage_end();
	return (int64) (n - held);
}

/* The worker's step: one chunk of due schedules. */
int64
pgjq_schedule_fire_chunk(void)
{
	int64		jobs;
	int64		n = fire_due(FIRE_CHUNK, &jobs);

	/* run_chunks goes on while a step returns a full chunk */
	return n == FIRE_CHUNK ? PGJQ_MAINTENANCE_CHUNK : n;
}

/* The earliest next slot of any schedule (DT_NOEND: none). */
TimestampTz
pgjq_schedule_next_slot(void)
{
	bool		isnull;
	Datum		d;
	TimestampTz t;
	TimestampTz clock = GetCurrentTimestamp();

	pgjq_spi_run(&plan_next, NULL, NULL, 1);
	d = pgjq_spi_get(0, 1, &isnull);
	t = isnull ? DT_NOEND : DatumGetTimestampTz(d);
	/* a held schedule stays due: look again in a second, not at once */
	if (held_at != 0 && clock - held_at < 2 * USECS_PER_SEC)
		t = Max(t, clock + USECS_PER_SEC);
	return t;
}

/* pgjq._fire_schedules(): every due schedule now; returns the jobs enqueued. */
Datum
pgjq_fire_schedules(PG_FUNCTION_ARGS)
{
	int64		total = 0;
	int64		jobs;

	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot fire schedules during recovery")));
	while (fire_due(FIRE_CHUNK, &jobs) == FIRE_CHUNK)
		total += jobs;
	total += jobs;
	PG_RETURN_INT64(total);
}
