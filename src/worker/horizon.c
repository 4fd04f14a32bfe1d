/*-------------------------------------------------------------------------
 *
 * horizon.c
 *	  The vacuum horizon guard: who holds back the xmin horizon of this
 *	  database, reported by pgjq.health() and watched by the worker.
 *
 * A queue in tables lives on vacuum: every claim and completion leaves dead
 * tuples, and vacuum may remove only those deleted before the oldest
 * transaction that can still see them (the xmin horizon).  Something that
 * pins the horizon (a session idle in transaction, a long report, a
 * forgotten prepared transaction or replication slot) lets dead tuples pile
 * up and every claim slows down.
 *
 * One query (plan_holder) finds the holder: the oldest, by age of its
 * transaction id, of
 *	 - backends of this database (or of none: a walsender's feedback) with a
 *	   backend_xid or backend_xmin, except the asking backend itself (its own
 *	   snapshot is not the problem it asks about) and lazy VACUUMs (their
 *	   xmin does not hold back other vacuums);
 *	 - prepared transactions of this database;
 *	 - replication slots, by the older of xmin and catalog_xmin (a logical
 *	   slot's catalog_xmin holds back only the system catalogs' vacuum).
 * It always returns one row: the holder's kind, xid and ages (0 when nothing
 * holds the horizon), and who it is.  The time a holder has held the horizon
 * is read from its own record: a backend's transaction start (its current
 * statement's start while it runs one without a transaction id, which is
 * when a READ COMMITTED snapshot was taken), a prepared transaction's
 * PREPARE time; a slot has none (NULL).  The query reads pg_stat_activity,
 * so it must run as a superuser (or pg_read_all_stats) to see other roles'
 * sessions: pgjq.health() is SECURITY DEFINER, the worker is a superuser.
 *
 * pgjq.health() (SQL-callable) returns that row.  pgjq_horizon_check() is
 * the worker's step (bgworker.c calls it each pass, inside a transaction): at
 * most once a second it runs the query and remembers, in process-local
 * state, the holder it last saw (kind, pid or slot or gid, and xid) since
 * when, and whether it warned.  Once a holder has held the horizon for
 * pgjq.horizon_warn_after (by its own start time, or for a slot or a
 * REPEATABLE READ snapshot by how long the worker has seen the same holder)
 * it logs one WARNING naming it; when that holder is gone (or holds a newer
 * xid), one LOG line.  The worker wakes at least every pgjq.max_sleep, so a
 * warning comes up to that much late.  No locks; no shared state.
 *
 *-------------------------------------------------------------------------
 */
#include "common/pgjq_common.h"
#include "worker/horizon.h"
#include "common/spi_plans.h"
#include "common/guc.h"
#include "engine/engine.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_health);

/* the worker looks at most this often, however often it passes */
#define CHECK_INTERVAL_MS	1000

/*
 * $1 this database, $2 the asking backend's pid.  The columns are those of
 * pgjq.health() in order (pgjq_health checks their types).
 */
static PgjqPlan plan_holder = {
	"SELECT h.holder, h.xid,"
	"       coalesce(pg_catalog.int8(pg_catalog.age(h.xid)), 0::pg_catalog.int8),"
	"       CASE WHEN h.holder IS NULL THEN 0::pg_catalog.float8"
	"            ELSE pg_catalog.date_part('epoch', pg_catalog.clock_timestamp() - h.held_since) END,"
	"       h.held_since, h.pid, h.backend_type, h.usename, h.application_name, h.state,"
	"       h.xact_start, h.query_start, h.slot_name, h.gid"
	"  FROM (VALUES (1)) one(x)"
	"  LEFT JOIN LATERAL ("
	"   SELECT * FROM ("
	"    SELECT 'backend'::pg_catalog.text AS holder,"
	"           CASE WHEN a.backend_xid IS NULL THEN a.backend_xmin"
	"                WHEN a.backend_xmin IS NULL THEN a.backend_xid"
	"                WHEN pg_catalog.age(a.backend_xid) >= pg_catalog.age(a.backend_xmin) THEN a.backend_xid"
	"                ELSE a.backend_xmin END AS xid,"
	"           CASE WHEN a.backend_xid IS NULL AND a.state = 'active' THEN a.query_start"
	"                ELSE a.xact_start END AS held_since,"
	"           a.pid, a.backend_type, a.usename::pg_catalog.text AS usename,"
	"           a.application_name, a.state, a.xact_start, a.query_start,"
	"           NULL::pg_catalog.text AS slot_name, NULL::pg_catalog.text AS gid"
	"      FROM pg_catalog.pg_stat_activity a"
	"     WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)"
	"       AND a.pid <> $2"
	"       AND (a.datid = $1 OR a.datid IS NULL)"
	"       AND NOT EXISTS (SELECT FROM pg_catalog.pg_stat_progress_vacuum v WHERE v.pid = a.pid)"
	"    UNION ALL"
	"    SELECT 'prepared transaction', p.transaction, p.prepared, NULL, NULL,"
	"           p.owner::pg_catalog.text, NULL, NULL, NULL, NULL, NULL, p.gid"
	"      FROM pg_catalog.pg_prepared_xacts p"
	"     WHERE p.database = pg_catalog.current_database()"
	"    UNION ALL"
	"    SELECT 'replication slot',"
	"           CASE WHEN s.catalog_xmin IS NULL THEN s.xmin"
	"                WHEN s.xmin IS NULL THEN s.catalog_xmin"
	"                WHEN pg_catalog.age(s.xmin) >= pg_catalog.age(s.catalog_xmin) THEN s.xmin"
	"                ELSE s.catalog_xmin END,"
	"           NULL, s.active_pid, NULL, NULL, NULL, NULL, NULL, NULL,"
	"           s.slot_name::pg_catalog.text, NULL"
	"      FROM pg_catalog.pg_replication_slots s"
	"     WHERE s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL"
	"   ) u"
	"   ORDER BY pg_catalog.age(u.xid) DESC, u.held_since NULLS LAST, u.pid, u.slot_name, u.gid"
	"   LIMIT 1"
	"  ) h ON true",
	2, {OIDOID, INT4OID}
};

/* result columns of plan_holder (1-based) */
#define COL_HOLDER			1
#define COL_XID				2
#define COL_AGE_XACTS		3
#define COL_HELD_SINCE		5
#define COL_PID				6
#define COL_APPLICATION		9
#define COL_STATE			10
#define COL_SLOT_NAME		13
#define COL_GID				14
#define NUM_COLS			14

typedef enum HolderKind
{
	HOLDER_NONE,
	HOLDER_BACKEND,
	HOLDER_PREPARED,
	HOLDER_SLOT
} HolderKind;

/* What the worker knows of a holder; strings copied out of SPI. */
typedef struct Holder
{
	HolderKind	kind;
	TransactionId xid;
	int			pid;			/* a backend's */
	char		name[GIDSIZE];	/* a slot's name or a prepared xact's gid */
	char		application[NAMEDATALEN];
	char		state[64];
	int64		age_xacts;
	TimestampTz held_since;		/* 0 when unknown (a slot) */
} Holder;

/* The worker's memory of the holder it watches (process-local). */
static Holder watched;
static TimestampTz watched_first_seen;
static bool watched_warned = false;
static TimestampTz last_check = 0;

/* Run plan_holder; the caller is connected to SPI.  One row. */
static void
run_holder_query(void)
{
	Datum		values[2];

	values[0] = ObjectIdGetDatum(MyDatabaseId);
	values[1] = Int32GetDatum(MyProcPid);
	if (pgjq_spi_run(&plan_holder, values, NULL, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "pgjq: the horizon query returned " UINT64_FORMAT " rows",
			 (uint64) SPI_processed);
}

/* the columns of pgjq.health() after the query's: the ring's refusals */
#define NUM_RING_COLS		3

/*
 * pgjq.health(): the horizon's holder and ages, and the due jobs the ring
 * had no room for (engine/ring_promote.c, promote_refused), as one row.  Runs as the
 * extension owner (SECURITY DEFINER), so it sees every session.
 */
Datum
pgjq_health(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	TupleDesc	got;
	Datum		values[NUM_COLS + NUM_RING_COLS];
	bool		nulls[NUM_COLS + NUM_RING_COLS];
	MemoryContext outer = CurrentMemoryContext;
	MemoryContext spi;
	HeapTuple	result;
	int64		refused;
	TimestampTz refused_at;
	const char *bound;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgjq: health() must return a row type");
	tupdesc = BlessTupleDesc(tupdesc);

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	run_holder_query();

	/* the SQL declaration and the query must agree column for column */
	got = SPI_tuptable->tupdesc;
	if (got->natts != NUM_COLS || tupdesc->natts != NUM_COLS + NUM_RING_COLS)
		elog(ERROR, "pgjq: health() is declared with %d columns, the query has %d",
			 tupdesc->natts, got->natts);
	for (int i = 0; i < got->natts; i++)
		if (TupleDescAttr(got, i)->atttypid != TupleDescAttr(tupdesc, i)->atttypid)
			elog(ERROR, "pgjq: health() column %d has the wrong type", i + 1);

	heap_deform_tuple(SPI_tuptable->vals[0], got, values, nulls);
	pgjq_ring_refusals(&refused, &refused_at, &bound);
	values[NUM_COLS] = Int64GetDatum(refused);
	nulls[NUM_COLS] = false;
	values[NUM_COLS + 1] = TimestampTzGetDatum(refused_at);
	nulls[NUM_COLS + 1] = refused_at == 0;
	values[NUM_COLS + 2] = bound ? CStringGetTextDatum(bound) : (Datum) 0;
	nulls[NUM_COLS + 2] = bound == NULL;
	/* formed (copied) in the caller's memory, before SPI's goes */
	spi = MemoryContextSwitchTo(outer);
	result = heap_form_tuple(tupdesc, values, nulls);
	MemoryContextSwitchTo(spi);
	SPI_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(result));
}

static void
copy_text(int col, char *dst, size_t size)
{
	bool		isnull;
	Datum		d = pgjq_spi_get(0, col, &isnull);

	if (isnull)
		dst[0] = '\0';
	else
	{
		char	   *s = TextDatumGetCString(d);

		strlcpy(dst, s, size);
		pfree(s);
	}
}

/* Read the holder into *h (kind HOLDER_NONE when nothing holds it). */
static void
read_holder(Holder *h)
{
	char		kind[32];
	bool		isnull;
	Datum		d;

	memset(h, 0, sizeof(Holder));
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	run_holder_query();
	Assert(SPI_tuptable->tupdesc->natts == NUM_COLS);

	copy_text(COL_HOLDER, kind, sizeof(kind));
	if (strcmp(kind, "backend") == 0)
		h->kind = HOLDER_BACKEND;
	else if (strcmp(kind, "prepared transaction") == 0)
		h->kind = HOLDER_PREPARED;
	else if (strcmp(kind, "replication slot") == 0)
		h->kind = HOLDER_SLOT;
	else
		h->kind = HOLDER_NONE;

	if (h->kind != HOLDER_NONE)
	{
		d = pgjq_spi_get(0, COL_XID, &isnull);
		h->xid = isnull ? InvalidTransactionId : DatumGetTransactionId(d);
		h->age_xacts = pgjq_spi_get_int64(0, COL_AGE_XACTS);
		d = pgjq_spi_get(0, COL_HELD_SINCE, &isnull);
		h->held_since = isnull ? 0 : DatumGetTimestampTz(d);
		d = pgjq_spi_get(0, COL_PID, &isnull);
		h->pid = isnull ? 0 : DatumGetInt32(d);
		copy_text(COL_APPLICATION, h->application, sizeof(h->application));
		copy_text(COL_STATE, h->state, sizeof(h->state));
		if (h->kind == HOLDER_SLOT)
			copy_text(COL_SLOT_NAME, h->name, sizeof(h->name));
		else if (h->kind == HOLDER_PREPARED)
			copy_text(COL_GID, h->name, sizeof(h->name));
	}
	SPI_finish();
}

static bool watched_counted_by_us(void);

/* The same holder: same kind, same who, same transaction id. */
static bool
same_holder(const Holder *a, const Holder *b)
{
	if (a->kind != b->kind || a->xid != b->xid)
		return false;
	if (a->kind == HOLDER_BACKEND)
		return a->pid == b->pid;
	return strcmp(a->name, b->name) == 0;
}

/*
 * "2 h 5 min", "5 min 3 s", "12 s"; "at least ..." when counted from the
 * worker's first sighting rather than the holder's own start.
 */
static void
format_duration(int64 secs, bool at_least, char *buf, size_t size)
{
	const char *prefix = at_least ? "at least " : "";

	if (secs >= 3600)
		snprintf(buf, size, "%s" INT64_FORMAT " h " INT64_FORMAT " min",
				 prefix, secs / 3600, (secs % 3600) / 60);
	else if (secs >= 60)
		snprintf(buf, size, "%s" INT64_FORMAT " min " INT64_FORMAT " s",
				 prefix, secs / 60, secs % 60);
	else
		snprintf(buf, size, "%s" INT64_FORMAT " s", prefix, secs);
}

/* errdetail of a warning about a backend or a prepared transaction */
static int
age_detail(int64 age_xacts)
{
	return errdetail_plural("The horizon is " INT64_FORMAT " transaction old; vacuum cannot remove rows deleted since, and queue operations slow down.",
							"The horizon is " INT64_FORMAT " transactions old; vacuum cannot remove rows deleted since, and queue operations slow down.",
							(unsigned long) age_xacts, age_xacts);
}

static void
warn_held(const Holder *h, int64 held_secs)
{
	char		dur[64];
	const char *db = get_database_name(MyDatabaseId);

	format_duration(held_secs, watched_counted_by_us(), dur, sizeof(dur));
	switch (h->kind)
	{
		case HOLDER_BACKEND:
			ereport(WARNING,
					(errmsg("pgjq: xmin horizon of database \"%s\" held for %s by process %d (application \"%s\", state \"%s\")",
							db, dur, h->pid, h->application, h->state),
					 age_detail(h->age_xacts),
					 errhint("End that transaction, or the session with pg_terminate_backend(%d).",
							 h->pid)));
			break;
		case HOLDER_PREPARED:
			ereport(WARNING,
					(errmsg("pgjq: xmin horizon of database \"%s\" held for %s by prepared transaction \"%s\"",
							db, dur, h->name),
					 age_detail(h->age_xacts),
					 errhint("Finish it with COMMIT PREPARED or ROLLBACK PREPARED.")));
			break;
		case HOLDER_SLOT:
			ereport(WARNING,
					(errmsg("pgjq: xmin horizon of database \"%s\" held for %s by replication slot \"%s\"",
							db, dur, h->name),
					 errdetail_plural("The horizon is " INT64_FORMAT " transaction old; vacuum cannot remove rows deleted since (only catalog rows when it is the slot's catalog_xmin).",
									  "The horizon is " INT64_FORMAT " transactions old; vacuum cannot remove rows deleted since (only catalog rows when it is the slot's catalog_xmin).",
									  (unsigned long) h->age_xacts, h->age_xacts),
					 errhint("Drop the slot with pg_drop_replication_slot() if nothing consumes it.")));
			break;
		case HOLDER_NONE:
			break;
	}
}

static void
log_released(const Holder *h, int64 held_secs)
{
	char		dur[64];
	const char *db = get_database_name(MyDatabaseId);

	format_duration(held_secs, watched_counted_by_us(), dur, sizeof(dur));
	switch (h->kind)
	{
		case HOLDER_BACKEND:
			ereport(LOG,
					(errmsg("pgjq: xmin horizon of database \"%s\" no longer held by process %d",
							db, h->pid),
					 errdetail("It was held for %s.", dur)));
			break;
		case HOLDER_PREPARED:
			ereport(LOG,
					(errmsg("pgjq: xmin horizon of database \"%s\" no longer held by prepared transaction \"%s\"",
							db, h->name),
					 errdetail("It was held for %s.", dur)));
			break;
		case HOLDER_SLOT:
			ereport(LOG,
					(errmsg("pgjq: xmin horizon of database \"%s\" no longer held by replication slot \"%s\"",
							db, h->name),
					 errdetail("It was held for %s.", dur)));
			break;
		case HOLDER_NONE:
			break;
	}
}

/*
 * True when the watched holder's time is counted from the worker's first
 * sighting: it has no start of its own (a slot, a walsender's feedback), or
 * the worker saw the same holder before that start (a REPEATABLE READ
 * snapshot between statements is older than the current statement).
 */
static bool
watched_counted_by_us(void)
{
	return watched.held_since == 0 || watched_first_seen < watched.held_since;
}

/* How long the watched holder has held the horizon, in seconds, at now. */
static int64
watched_secs(TimestampTz now)
{
	TimestampTz since = watched_first_seen;

	/* its own start when it has one and that is earlier than our first look */
	if (watched.held_since != 0 && watched.held_since < since)
		since = watched.held_since;
	return now > since ? (now - since) / USECS_PER_SEC : 0;
}

/*
 * The worker's step: warn once about a holder past pgjq.horizon_warn_after,
 * log once when it lets go.  Called by bgworker.c every pass, in a
 * transaction with an active snapshot; returns 0 (nothing for run_step's
 * count).
 */
int64
pgjq_horizon_check(void)
{
	TimestampTz now = GetCurrentTimestamp();
	Holder		h;

	if (pgjq_horizon_warn_after_s <= 0)
	{
		/* disabled: forget what we watched, say nothing */
		watched.kind = HOLDER_NONE;
		watched_warned = false;
		return 0;
	}
	if (last_check != 0 && !TimestampDifferenceExceeds(last_check, now, CHECK_INTERVAL_MS))
		return 0;
	last_check = now;

	read_holder(&h);
	if (watched.kind != HOLDER_NONE && !same_holder(&watched, &h))
	{
		if (watched_warned)
			log_released(&watched, watched_secs(now));
		watched.kind = HOLDER_NONE;
		watched_warned = false;
	}
	if (h.kind == HOLDER_NONE)
		return 0;
	if (watched.kind == HOLDER_NONE)
		watched_first_seen = now;

	/* keep the latest state and start (a session goes active and idle) */
	watched = h;
	if (!watched_warned &&
		watched_secs(now) >= (int64) pgjq_horizon_warn_after_s)
	{
		warn_held(&watched, watched_secs(now));
		watched_warned = true;
	}
	return 0;
}
