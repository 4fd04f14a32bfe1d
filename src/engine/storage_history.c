/*-------------------------------------------------------------------------
 *
 * storage_history.c
 *	  Hourly partitions of pgjq.job_done and pgjq.job_history: create
 *	  ahead, prune whole.
 *
 * A partition covers one UTC hour of finished_at and is named
 * <table>_YYYYMMDD_HH; the two tables' partitions for an hour are created
 * together.  pgjq_history_ensure() runs before every insert into history: a
 * syscache probe when the partitions exist (the common case, as maintenance
 * creates the next hour ahead), else it creates them.  Creation
 * is CREATE TABLE then ATTACH PARTITION, which needs only a SHARE UPDATE
 * EXCLUSIVE lock on the parent: concurrent inserts into other partitions go
 * on, and two creators serialize on that lock and re-check after it.
 *
 * The parents have no indexes: each partition gets its own when it is
 * created (see create_partition_indexes), so that pg_dump and pg_restore
 * handle the partitions like any other table.
 *
 * Pruning (maintenance only): every bound below is shifted by a grace of
 * GRACE (passed as $2): a finishing call takes its finish time a moment
 * before it inserts, so a partition may still receive rows just after its
 * hour ends.  Once a partition's hour (plus grace) has passed it records
 * which queues have rows in it; when its end plus the longest retention of
 * those queues has passed, it is truncated (space back at once, no dead
 * tuples, no VACUUM) and then dropped when the parent's lock can be had
 * without waiting; otherwise the drop is tried again on the next pass.
 *
 * Dropping a partition takes ACCESS EXCLUSIVE on its parent, which every
 * insert into history (complete, a dead or cancelled job) waits for until
 * the transaction ends.  So the work is cut into pgjq_history_prepare()
 * (create ahead, record queues) and pgjq_history_prune_one() (one
 * partition), and the background worker runs each in its own short
 * transaction: the parent is locked only for one DROP and its commit.
 * Maintenance never waits for the parent's lock: creating ahead and dropping
 * use conditional locks (a busy parent means "next pass"), so a client
 * holding a lock on history cannot stall promotion and rescue.
 * pgjq_history_prune() (SQL prune()) does it all in the caller's
 * transaction, which then holds the parents' locks until it ends.
 *
 * job_done's BRIN index finds a job only in the ranges it has summarized;
 * the pages of any other range are read in full by every lookup.  PostgreSQL
 * summarizes a BRIN index only at VACUUM (or through autovacuum's work
 * items), so the worker does it itself (pgjq_history_summarize): the filled
 * ranges of the partitions still receiving rows on every pass, and the last,
 * partial range once the partition's hour is over.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/storage_internal.h"

#include "access/brin.h"
#include "access/genam.h"
#include "access/heapam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "access/table.h"
#include "catalog/pg_am_d.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "pgtime.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/fmgrprotos.h"
#include "utils/rel.h"

static PgjqPlan plan_register = {
	"INSERT INTO pgjq.history_partition (relname, parent, lower_bound, upper_bound)"
	" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
	4, {NAMEOID, NAMEOID, TIMESTAMPTZOID, TIMESTAMPTZOID}
};

/* The partitioned tables; the last one's partition is created last. */
static const char *const history_tables[] = {"job_history", "job_done"};

static PgjqPlan plan_to_close = {
	"SELECT relname FROM pgjq.history_partition"
	" WHERE queue_ids IS NULL AND upper_bound + $2 <= $1"
	"   AND upper_bound + $2 + (SELECT coalesce(max(retention), '0') FROM pgjq.queue) > $1",
	2, {TIMESTAMPTZOID, INTERVALOID}
};

/* The ($3 + 1)-th oldest expired partition (the earlier ones are skipped). */
static PgjqPlan plan_expired = {
	"SELECT hp.relname, hp.queue_ids = '{}' AS emptied, hp.parent"
	"  FROM pgjq.history_partition hp"
	" WHERE hp.upper_bound + $2 <= $1"
	"   AND hp.upper_bound + $2 + CASE WHEN hp.queue_ids IS NULL"
	"         THEN (SELECT coalesce(max(q.retention), '0') FROM pgjq.queue q)"
	"         ELSE (SELECT coalesce(max(q.retention), '0') FROM pgjq.queue q"
	"                WHERE q.queue_id = ANY (hp.queue_ids)) END <= $1"
	" ORDER BY hp.upper_bound, hp.relname LIMIT 1 OFFSET $3",
	3, {TIMESTAMPTZOID, INTERVALOID, INT4OID}
};

static PgjqPlan plan_mark_emptied = {
	"UPDATE pgjq.history_partition SET queue_ids = '{}' WHERE relname = $1",
	1, {NAMEOID}
};

static PgjqPlan plan_unregister = {
	"DELETE FROM pgjq.history_partition WHERE relname = $1",
	1, {NAMEOID}
};

/* How long after its hour a partition may still receive rows (see header). */
#define GRACE	(5 * 60 * USECS_PER_SEC)

/* Start of the UTC hour holding ts. */
static TimestampTz
hour_start(TimestampTz ts)
{
	TimestampTz h = ts - ts % USECS_PER_HOUR;

	if (ts % USECS_PER_HOUR < 0)
		h -= USECS_PER_HOUR;
	return h;
}

static void
partition_name(const char *table, TimestampTz start, char *buf, size_t len)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(start, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("timestamp out of range")));
	snprintf(buf, len, "%s_%04d%02d%02d_%02d",
			 table, tm.tm_year, tm.tm_mon, tm.tm_mday, tm.tm_hour);
}

/* Seconds since the Unix epoch, for partition bounds. */
static int64
unix_seconds(TimestampTz ts)
{
	return ts / USECS_PER_SEC +
		(int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY;
}

/*
 * Each partition gets its own indexes, made while it is new and empty: the
 * parents have none.  A partitioned index on a parent that CREATE EXTENSION
 * makes would break pg_restore, which attaches a dumped partition (creating
 * its index from the parent's) and then creates the dumped index again.
 */
static void
create_partition_indexes(const char *table, const char *name)
{
	/*
	 * 32 pages per range: a lookup reads the pages of the ranges that match,
	 * and those of the filling range that is not summarized yet.
	 */
	if (strcmp(table, "job_done") == 0)
		pgjq_spi_exec_utility(psprintf("CREATE INDEX %s_id_idx ON pgjq.%s"
									   " USING brin (min_id, max_id)"
									   " WITH (pages_per_range = 32)", name, name));
	else
	{
		pgjq_spi_exec_utility(psprintf("CREATE INDEX %s_id_idx ON pgjq.%s (id)",
									   name, name));
		pgjq_spi_exec_utility(psprintf("CREATE INDEX %s_dead_idx ON pgjq.%s (queue_id)"
									   " WHERE state OPERATOR(pg_catalog.=) 'd'",
									   name, name));
	}
}

/*
 * Create and attach the partition of `table` for the hour starting at `lo`
 * unless it exists.  With nowait, gives up (returns false) when the parent's
 * lock is taken; else waits for it (lock_timeout applies).
 */
static bool
create_partition(const char *table, TimestampTz lo, bool nowait)
{
	char		name[NAMEDATALEN];
	Oid			parent = pgjq_relation(table);
	Datum		values[4];

	if (!OidIsValid(parent))
		elog(ERROR, "pgjq: table pgjq.%s is missing", table);
	partition_name(table, lo, name, sizeof(name));
	if (nowait)
	{
		if (!ConditionalLockRelationOid(parent, ShareUpdateExclusiveLock))
			return false;
	}
	else
		LockRelationOid(parent, ShareUpdateExclusiveLock);
	if (OidIsValid(pgjq_relation(name)))
		return true;
	pgjq_spi_exec_utility(psprintf("CREATE TABLE pgjq.%s"
								   " (LIKE pgjq.%s INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
								   name, table));
	create_partition_indexes(table, name);
	pgjq_spi_exec_utility(psprintf("ALTER TABLE pgjq.%s ATTACH PARTITION pgjq.%s"
								   " FOR VALUES FROM (pg_catalog.to_timestamp(" INT64_FORMAT "))"
								   " TO (pg_catalog.to_timestamp(" INT64_FORMAT "))",
								   table, name, unix_seconds(lo),
								   unix_seconds(lo + USECS_PER_HOUR)));
	values[0] = DirectFunctionCall1(namein, CStringGetDatum(name));
	values[1] = DirectFunctionCall1(namein, CStringGetDatum(table));
	values[2] = TimestampTzGetDatum(lo);
	values[3] = TimestampTzGetDatum(lo + USECS_PER_HOUR);
	pgjq_spi_run(&plan_register, values, NULL, 0);
	return true;
}

/* Create the history partitions for finished_at = ts unless they exist. */
static void
ensure(TimestampTz ts, bool nowait)
{
	TimestampTz lo = hour_start(ts);
	char		name[NAMEDATALEN];

	partition_name(history_tables[lengthof(history_tables) - 1], lo, name, sizeof(name));
	if (OidIsValid(pgjq_relation(name)))
		return;
	for (int i = 0; i < lengthof(history_tables); i++)
		if (!create_partition(history_tables[i], lo, nowait))
			return;
}

/*
 * Make sure the history partitions for finished_at = ts exist (an insert
 * needs them, so this waits for the parent's lock).  Caller is connected to
 * SPI.
 */
void
pgjq_history_ensure(TimestampTz ts)
{
	ensure(ts, false);
}

/* job_done's columns, in the order pgjq_history_insert_done takes them */
static const char *const done_cols[PGJQ_DONE_NATTS] = {
	"queue_id", "finished_at", "min_id", "max_id", "ids", "attempts", "enqueued_at", "results"
};

/*
 * One job_done row (values and nulls in done_cols' order), inserted straight
 * into the partition of its hour and that partition's indexes.  Through SPI,
 * an INSERT into the partitioned parent was more than half of a complete()
 * call's CPU (executor start-up and tuple routing, at every call).  The
 * parent is locked as an INSERT would lock it (RowExclusiveLock), so a
 * partition drop waits for this transaction, as it did for the INSERT.
 */
void
pgjq_history_insert_done(const Datum *values, const bool *nulls)
{
	TimestampTz finished_at = DatumGetTimestampTz(values[1]);
	TimestampTz lo = hour_start(finished_at);
	char		name[NAMEDATALEN];
	Oid			parent = pgjq_relation("job_done");
	Oid			relid;
	Relation	rel;
	TupleDesc	desc;
	Datum	   *v;
	bool	   *n;
	HeapTuple	tup;
	List	   *idxoids;
	ListCell   *lc;

	if (!OidIsValid(parent))
		elog(ERROR, "pgjq: table pgjq.job_done is missing");
	LockRelationOid(parent, RowExclusiveLock);
	partition_name("job_done", lo, name, sizeof(name));
	relid = pgjq_relation(name);
	if (!OidIsValid(relid))
	{
		ensure(finished_at, false);
		relid = pgjq_relation(name);
		if (!OidIsValid(relid))
			elog(ERROR, "pgjq: partition pgjq.%s is missing", name);
	}
	rel = table_open(relid, RowExclusiveLock);
	desc = RelationGetDescr(rel);
	v = palloc0(sizeof(Datum) * desc->natts);
	n = palloc(sizeof(bool) * desc->natts);
	for (int a = 0; a < desc->natts; a++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, a);
		int			c;

		n[a] = true;
		if (att->attisdropped)
			continue;
		for (c = 0; c < PGJQ_DONE_NATTS; c++)
			if (strcmp(NameStr(att->attname), done_cols[c]) == 0)
				break;
		if (c == PGJQ_DONE_NATTS)
		{
			if (!att->attnotnull)
				continue;
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table pgjq.%s has an unknown column \"%s\"",
							name, NameStr(att->attname)),
					 errhint("Update or recreate the extension pgjq.")));
		}
		v[a] = values[c];
		n[a] = nulls[c];
	}
	tup = heap_form_tuple(desc, v, n);
	heap_insert(rel, tup, GetCurrentCommandId(true), 0, NULL);

	/* its indexes: the BRIN on (min_id, max_id) that create_partition gives */
	idxoids = RelationGetIndexList(rel);
	foreach(lc, idxoids)
	{
		Relation	idx = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *ii = BuildIndexInfo(idx);
		Datum		iv[INDEX_MAX_KEYS];
		bool		in[INDEX_MAX_KEYS];

		if (ii->ii_Expressions != NIL || ii->ii_Predicate != NIL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("an index with expressions or a predicate on %s is not supported",
							name)));
		for (int k = 0; k < ii->ii_NumIndexAttrs; k++)
		{
			AttrNumber	at = ii->ii_IndexAttrNumbers[k];

			iv[k] = v[at - 1];
			in[k] = n[at - 1];
		}
		index_insert(idx, iv, in, &tup->t_self, rel,
					 idx->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO, false, ii);
		pgjq_index_insert_cleanup(idx, ii);
		index_close(idx, NoLock);
	}
	list_free(idxoids);
	heap_freetuple(tup);
	table_close(rel, NoLock);
}

/* Try to take a lock without waiting, a few times over ~100 ms. */
static bool
lock_soon(Oid relid, LOCKMODE mode)
{
	for (int i = 0; i < 5; i++)
	{
		if (ConditionalLockRelationOid(relid, mode))
			return true;
		CHECK_FOR_INTERRUPTS();
		pg_usleep(20000L);
	}
	return false;
}

/*
 * Summarize the BRIN ranges of job_done partition `name` that are not yet:
 * with `all`, every one (the partition gets no more rows); else only the
 * filled ones.  A summarized range whose rows keep coming would have its
 * summary updated, and WAL written, at nearly every insert (max_id keeps
 * growing), so the filling range is left to the next call.  Ranges fill in
 * order and only this function and VACUUM summarize them (the index has no
 * autosummarize), so the summarized ones are a prefix: the walk goes back
 * from the last filled range to the first one already summarized.  Skipped
 * when a lock is busy (VACUUM or a DROP holds it).  Returns the number of
 * ranges summarized.
 */
static int64
summarize_partition(const char *name, bool all)
{
	char		idxname[NAMEDATALEN];
	Oid			heapoid = pgjq_relation(name);
	Oid			idxoid;
	Relation	heap;
	Relation	index;
	BlockNumber nblocks;
	BlockNumber per_range;
	int64		done = 0;

	snprintf(idxname, sizeof(idxname), "%s_id_idx", name);
	idxoid = pgjq_relation(idxname);
	if (!OidIsValid(heapoid) || !OidIsValid(idxoid) || RecoveryInProgress())
		return 0;
	/* the locks brin_summarize_range takes, in its order, without waiting */
	if (!ConditionalLockRelationOid(heapoid, ShareUpdateExclusiveLock))
		return 0;
	if (!ConditionalLockRelationOid(idxoid, ShareUpdateExclusiveLock))
		return 0;
	heap = table_open(heapoid, NoLock);
	index = index_open(idxoid, NoLock);
	if (index->rd_rel->relam != BRIN_AM_OID || index->rd_index->indrelid != heapoid)
	{
		/* not the index pgjq made (a restore with other names?): leave it */
		index_close(index, NoLock);
		table_close(heap, NoLock);
		return 0;
	}
	per_range = BrinGetPagesPerRange(index);
	nblocks = RelationGetNumberOfBlocks(heap);
	index_close(index, NoLock);
	table_close(heap, NoLock);

	if (all)
		return DatumGetInt32(DirectFunctionCall1(brin_summarize_new_values,
												 ObjectIdGetDatum(idxoid)));
	for (int64 blk = (int64) (nblocks - nblocks % per_range) - per_range;
		 blk >= 0; blk -= per_range)
	{
		int32		n;

		CHECK_FOR_INTERRUPTS();
		n = DatumGetInt32(DirectFunctionCall2(brin_summarize_range,
											  ObjectIdGetDatum(idxoid),
											  Int64GetDatum(blk)));
		if (n == 0)
			break;
		done += n;
	}
	return done;
}

/*
 * Summarize the filled BRIN ranges of the job_done partitions that may still
 * receive rows: this hour's and, within the grace, the last hour's.  Returns
 * how many ranges were summarized.
 */
int64
pgjq_history_summarize(TimestampTz now)
{
	char		name[NAMEDATALEN];
	int64		done = 0;

	partition_name("job_done", hour_start(now), name, sizeof(name));
	done += summarize_partition(name, false);
	if (hour_start(now - GRACE) != hour_start(now))
	{
		partition_name("job_done", hour_start(now - GRACE), name, sizeof(name));
		done += summarize_partition(name, false);
	}
	return done;
}

/*
 * The first part of pruning: create this hour's and the next hour's
 * partitions ahead of need (skipped when the parent is busy: an insert
 * creates them itself), and record which queues have rows in each partition
 * whose hour is over.  Caller is connected to SPI.
 */
void
pgjq_history_prepare(TimestampTz now)
{
	Datum		values[2] = {TimestampTzGetDatum(now), pgjq_interval_datum(GRACE)};
	int			n;
	char	  **names;

	ensure(now, true);
	ensure(now + USECS_PER_HOUR, true);

	pgjq_spi_run(&plan_to_close, values, NULL, 0);
	n = (int) SPI_processed;
	names = palloc(sizeof(char *) * Max(n, 1));
	for (int i = 0; i < n; i++)
		names[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
	for (int i = 0; i < n; i++)
	{
		const char *rel = quote_identifier(names[i]);

		CHECK_FOR_INTERRUPTS();
		/* no more rows come: its last, partial range can be summarized */
		if (strncmp(names[i], "job_done_", 9) == 0)
			summarize_partition(names[i], true);
		pgjq_spi_exec_utility(psprintf("UPDATE pgjq.history_partition"
									   "   SET queue_ids = (SELECT coalesce(array_agg(DISTINCT queue_id), '{}')"
									   "                      FROM pgjq.%s)"
									   " WHERE relname = %s",
									   rel, quote_literal_cstr(names[i])));
	}
}

/*
 * Remove one expired partition: the oldest after skipping `skip` of them
 * (the ones the caller could not remove).  Truncates it unless that was done
 * already (adding 1 to *pruned), then drops it if the parent's lock can be
 * had without waiting for long.  Returns -1 when there is no such partition,
 * 1 when it is gone, 0 when it stays for a later pass (a lock was busy).
 * Caller is connected to SPI.
 */
int
pgjq_history_prune_one(TimestampTz now, int skip, int64 *pruned)
{
	Datum		values[3] = {TimestampTzGetDatum(now), pgjq_interval_datum(GRACE),
	Int32GetDatum(skip)};
	Datum		name_datum[1];
	char	   *name;
	char	   *parent;
	bool		emptied;
	bool		isnull;
	Oid			relid;

	pgjq_spi_run(&plan_expired, values, NULL, 1);
	if (SPI_processed == 0)
		return -1;
	name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	emptied = DatumGetBool(pgjq_spi_get(0, 2, &isnull));
	emptied = emptied && !isnull;
	parent = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);

	relid = pgjq_relation(name);
	name_datum[0] = DirectFunctionCall1(namein, CStringGetDatum(name));
	if (!OidIsValid(relid))
	{
		pgjq_spi_run(&plan_unregister, name_datum, NULL, 0);
		return 1;
	}
	if (!emptied)
	{
		if (!lock_soon(relid, AccessExclusiveLock))
			return 0;
		pgjq_spi_exec_utility(psprintf("TRUNCATE pgjq.%s", quote_identifier(name)));
		pgjq_spi_run(&plan_mark_emptied, name_datum, NULL, 0);
		(*pruned)++;
	}
	/* last, so that the parent stays locked only for the drop and the commit */
	if (!lock_soon(pgjq_relation(parent), AccessExclusiveLock))
		return 0;
	pgjq_spi_exec_utility(psprintf("DROP TABLE pgjq.%s", quote_identifier(name)));
	pgjq_spi_run(&plan_unregister, name_datum, NULL, 0);
	return 1;
}

/*
 * Remove history whose retention has passed, whole partitions at a time, in
 * the caller's transaction.  Returns how many partitions were emptied.  Also
 * creates the next hour's partition ahead of need.
 */
int64
pgjq_history_prune(TimestampTz now)
{
	int64		pruned = 0;
	int			skip = 0;
	int			r;

	pgjq_history_prepare(now);
	while ((r = pgjq_history_prune_one(now, skip, &pruned)) >= 0)
	{
		CHECK_FOR_INTERRUPTS();
		if (r == 0)
			skip++;
	}
	return pruned;
}
