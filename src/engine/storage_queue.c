/*-------------------------------------------------------------------------
 *
 * storage_queue.c
 *	  Queue rows: lookup, create, alter, pause, drop, purge.
 *
 * Locking: enqueue, retry_dead and claims take a shared lock on the queue's
 * name (pgjq_storage_queue_lock) before looking the queue up; drop_queue
 * takes it exclusively.  So a drop waits for producers and claims in flight,
 * and one that waited finds the queue gone instead of inserting orphan jobs
 * or leasing jobs the drop did not count (a claim that took nothing gives
 * its lock back at once: claim.c).  The lock is
 * a heavyweight advisory-style lock held until the transaction ends: no row
 * lock, no WAL, no contention between producers.
 *
 * Cache: every backend keeps the queue rows it has read, by name, so claim
 * and enqueue need no query for them.  Every change to a queue row sends a
 * relcache invalidation of pgjq.queue, which PostgreSQL delivers to all
 * backends when the change commits (and to this one at once); it empties
 * the cache.  Every lookup reads pending invalidations first (as a lock
 * acquisition does), so a lookup sees every queue change committed before it,
 * as a READ COMMITTED query would; so does a producer that waited for a drop
 * on the queue-name lock.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/storage_internal.h"
#include "state/limits.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "storage/sinval.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/hsearch.h"
#include "utils/inval.h"

#include "common/hashfn.h"
#include "common/args.h"
#include "state/wait.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

/* field4 of the lock tag, apart from user advisory locks (which use 1 and 2) */
#define PGJQ_LOCKTAG_QUEUE	0x706A
#define PGJQ_LOCKTAG_PROMOTIONS	0x706C

static PgjqPlan plan_insert = {
	"INSERT INTO pgjq.queue (name, lease, max_attempts, backoff_base, backoff_max, retention,"
	"                        concurrency, key_concurrency, rate, burst, timeout, key_rate, key_burst)"
	" VALUES ($1, $2, $3, $4, $5, $6, nullif($7, 0), nullif($8, 0), nullif($9, 0), nullif($10, 0),"
	"         nullif($11, '0'::interval), nullif($12, 0), nullif($13, 0))"
	" ON CONFLICT (name) DO NOTHING RETURNING queue_id",
	13, {TEXTOID, INTERVALOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID,
	INT4OID, INT4OID, FLOAT8OID, INT4OID, INTERVALOID, FLOAT8OID, INT4OID}
};

static PgjqPlan plan_update = {
	"UPDATE pgjq.queue SET lease = COALESCE($2, lease),"
	"       max_attempts = COALESCE($3, max_attempts),"
	"       backoff_base = COALESCE($4, backoff_base),"
	"       backoff_max = COALESCE($5, backoff_max),"
	"       retention = COALESCE($6, retention),"
	"       concurrency = CASE WHEN $7 IS NULL THEN concurrency ELSE nullif($7, 0) END,"
	"       key_concurrency = CASE WHEN $8 IS NULL THEN key_concurrency ELSE nullif($8, 0) END,"
	"       rate = CASE WHEN $9 IS NULL THEN rate ELSE nullif($9, 0) END,"
	"       burst = CASE WHEN $10 IS NULL THEN burst ELSE nullif($10, 0) END,"
	"       timeout = CASE WHEN $11 IS NULL THEN timeout ELSE nullif($11, '0'::interval) END,"
	"       key_rate = CASE WHEN $12 IS NULL THEN key_rate ELSE nullif($12, 0) END,"
	"       key_burst = CASE WHEN $13 IS NULL THEN key_burst ELSE nullif($13, 0) END"
	" WHERE queue_id = $1",
	13, {INT4OID, INTERVALOID, INT4OID, INTERVALOID, INTERVALOID, INTERVALOID,
	INT4OID, INT4OID, FLOAT8OID, INT4OID, INTERVALOID, FLOAT8OID, INT4OID}
};

static PgjqPlan plan_set_paused = {
	"UPDATE pgjq.queue SET paused = $2 WHERE queue_id = $1",
	2, {INT4OID, BOOLOID}
};

static PgjqPlan plan_delete_jobs = {
	"DELETE FROM pgjq.job WHERE queue_id = $1",
	1, {INT4OID}, NULL, true
};

static PgjqPlan plan_delete_holds = {
	"WITH p AS (DELETE FROM pgjq.dedup_period WHERE queue_id = $1)"
	" DELETE FROM pgjq.key_holds WHERE queue_id = $1",
	1, {INT4OID}
};

static PgjqPlan plan_delete = {
	"DELETE FROM pgjq.queue WHERE queue_id = $1",
	1, {INT4OID}
};

static PgjqPlan plan_purge = {
	"DELETE FROM pgjq.job WHERE queue_id = $1 AND state IN ('s', 'r')",
	1, {INT4OID}, NULL, true
};

void
pgjq_storage_queue_lock(const char *name, LOCKMODE mode)
{
	LOCKTAG		tag;
	uint32		h = hash_bytes((const unsigned char *) name, strlen(name));

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, h, 0, PGJQ_LOCKTAG_QUEUE);
	(void) LockAcquire(&tag, mode, false, false);
	/* as LockRelationOid does: see what committed while we waited */
	AcceptInvalidationMessages();
}

/*
 * The promotion lock of this database.  A promotion (ring_promote.c) takes it
 * in RowExclusiveLock (promotions do not conflict with each other) once per
 * batch that moves rows, before the rows leave pgjq.job, and holds it to its
 * transaction's end; a transaction's locks go after its commit callbacks,
 * which publish the promoted jobs in the ring.  So whoever takes it in
 * ShareLock (pgjq_storage_promotions_wait: a move's final drain check and
 * its release, src/citus/moves.c) waits for every promotion in flight to
 * have published its jobs, and a snapshot taken after that sees each job
 * either as a row of pgjq.job or in the ring, never in neither.  Cost on a
 * single server: one heavyweight lock per promotion batch that moves rows,
 * never waited for (nothing else takes ShareLock there).
 */
void
pgjq_storage_promotion_lock(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, PGJQ_LOCKTAG_PROMOTIONS);
	(void) LockAcquire(&tag, RowExclusiveLock, false, false);
}

/* Waits until no promotion is in flight; holds the lock to the transaction's end. */
void
pgjq_storage_promotions_wait(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0, 0, PGJQ_LOCKTAG_PROMOTIONS);
	(void) LockAcquire(&tag, ShareLock, false, false);
}

/*
 * Gives back one pgjq_storage_queue_lock of this transaction (a claim that
 * took nothing); one taken before by the transaction stays held.
 */
void
pgjq_storage_queue_unlock(const char *name, LOCKMODE mode)
{
	LOCKTAG		tag;
	uint32		h = hash_bytes((const unsigned char *) name, strlen(name));

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, h, 0, PGJQ_LOCKTAG_QUEUE);
	(void) LockRelease(&tag, mode, false);
}

typedef struct CachedQueue
{
	char		name[PGJQ_MAX_QUEUE_NAME + 1];
	PgjqQueue	queue;
} CachedQueue;

static HTAB *queue_cache = NULL;
static Oid	queue_cache_relid = InvalidOid;
static bool queue_cache_stale = false;

static void
queue_cache_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == queue_cache_relid)
		queue_cache_stale = true;
}

/*
 * The cache, emptied if stale or if pgjq.queue is a different table now.
 * Reading pending invalidations first gives each call the READ COMMITTED
 * view of the queue rows, even inside a long transaction or a waiting claim.
 */
static HTAB *
queue_cache_get(void)
{
	Oid			relid;

	AcceptInvalidationMessages();
	relid = pgjq_relation("queue");

	if (queue_cache == NULL)
	{
		HASHCTL		ctl;

		CacheRegisterRelcacheCallback(queue_cache_invalidate, (Datum) 0);
		memset(&ctl, 0, sizeof(ctl));
		ctl.keysize = PGJQ_MAX_QUEUE_NAME + 1;
		ctl.entrysize = sizeof(CachedQueue);
		queue_cache = hash_create("pgjq queues", 64, &ctl, HASH_ELEM | HASH_STRINGS);
	}
	else if (queue_cache_stale || relid != queue_cache_relid)
	{
		HASH_SEQ_STATUS scan;
		CachedQueue *e;

		hash_seq_init(&scan, queue_cache);
		while ((e = hash_seq_search(&scan)) != NULL)
			hash_search(queue_cache, e->name, HASH_REMOVE, NULL);
	}
	queue_cache_relid = relid;
	queue_cache_stale = false;
	return queue_cache;
}

/* Tell every backend (at commit) that queue rows changed. */
static void
queue_changed(void)
{
	CacheInvalidateRelcacheByRelid(pgjq_relation("queue"));
}

/*
 * pgjq.queue's columns as read by queue_read, looked up by name once per
 * backend (and again if the table is a different one), and its unique
 * index on name.
 */
enum
{
	QC_QUEUE_ID, QC_NAME, QC_LEASE, QC_MAX_ATTEMPTS, QC_BACKOFF_BASE, QC_BACKOFF_MAX,
	QC_RETENTION, QC_CONCURRENCY, QC_KEY_CONCURRENCY, QC_RATE, QC_BURST, QC_PAUSED, QC_TIMEOUT,
	QC_KEY_RATE, QC_KEY_BURST, QC_N
};
static const char *const queue_cols[QC_N] = {
	"queue_id", "name", "lease", "max_attempts", "backoff_base", "backoff_max",
	"retention", "concurrency", "key_concurrency", "rate", "burst", "paused", "timeout",
	"key_rate", "key_burst"
};
static Oid	queue_layout_relid = InvalidOid;
static AttrNumber queue_attno[QC_N];
static Oid	queue_name_index = InvalidOid;

static void
queue_layout(Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	List	   *indexes;
	ListCell   *lc;

	if (queue_layout_relid == RelationGetRelid(rel))
		return;
	for (int c = 0; c < QC_N; c++)
	{
		queue_attno[c] = InvalidAttrNumber;
		for (int a = 0; a < desc->natts; a++)
		{
			Form_pg_attribute att = TupleDescAttr(desc, a);

			if (!att->attisdropped && strcmp(NameStr(att->attname), queue_cols[c]) == 0)
				queue_attno[c] = att->attnum;
		}
		if (queue_attno[c] == InvalidAttrNumber)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("table pgjq.queue has no column \"%s\"", queue_cols[c]),
					 errhint("Update or recreate the extension pgjq.")));
	}
	queue_name_index = InvalidOid;
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		Relation	idx = index_open(lfirst_oid(lc), AccessShareLock);

		if (idx->rd_index->indisunique && idx->rd_index->indnatts == 1 &&
			idx->rd_index->indkey.values[0] == queue_attno[QC_NAME])
			queue_name_index = RelationGetRelid(idx);
		index_close(idx, AccessShareLock);
	}
	list_free(indexes);
	if (!OidIsValid(queue_name_index))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table pgjq.queue has no unique index on name"),
				 errhint("Update or recreate the extension pgjq.")));
	queue_layout_relid = RelationGetRelid(rel);
}

static int32
int_col(TupleTableSlot *slot, int c)
{
	bool		isnull;
	Datum		d = slot_getattr(slot, queue_attno[c], &isnull);

	return isnull ? 0 : DatumGetInt32(d);
}

static double
float_col(TupleTableSlot *slot, int c)
{
	bool		isnull;
	Datum		d = slot_getattr(slot, queue_attno[c], &isnull);

	return isnull ? 0 : DatumGetFloat8(d);
}

/* an interval column in microseconds; NULL (a nullable one: timeout) is 0 */
static int64
interval_col(TupleTableSlot *slot, int c)
{
	bool		isnull;
	Datum		d = slot_getattr(slot, queue_attno[c], &isnull);

	return isnull ? 0 : pgjq_interval_usec(DatumGetIntervalP(d));
}

/*
 * The queue row by name, read from pgjq.queue's name index directly.  As an
 * SPI query its parse and plan were half of a backend's first claim (twenty
 * workers starting at once pay that together: bench D1).  The snapshot is
 * the one a read-write SPI statement takes (fresh under READ COMMITTED), and
 * the lock is kept to the end of the transaction, as a query's would be.
 */
static bool
queue_read(const char *name, PgjqQueue *queue)
{
	Relation	rel = table_open(pgjq_relation("queue"), AccessShareLock);
	Relation	idx;
	ScanKeyData key;
	Snapshot	snap;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found;
	bool		isnull;

	queue_layout(rel);
	idx = index_open(queue_name_index, AccessShareLock);
	snap = RegisterSnapshot(GetTransactionSnapshot());
	ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, CStringGetTextDatum(name));
	slot = table_slot_create(rel, NULL);
	scan = pgjq_index_beginscan(rel, idx, snap, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		queue->queue_id = int_col(slot, QC_QUEUE_ID);
		queue->lease_us = interval_col(slot, QC_LEASE);
		queue->max_attempts = int_col(slot, QC_MAX_ATTEMPTS);
		queue->backoff_base_us = interval_col(slot, QC_BACKOFF_BASE);
		queue->backoff_max_us = interval_col(slot, QC_BACKOFF_MAX);
		queue->retention_us = interval_col(slot, QC_RETENTION);
		queue->paused = DatumGetBool(slot_getattr(slot, queue_attno[QC_PAUSED], &isnull));
		queue->concurrency = int_col(slot, QC_CONCURRENCY);
		queue->key_concurrency = int_col(slot, QC_KEY_CONCURRENCY);
		queue->rate = float_col(slot, QC_RATE);
		queue->burst = int_col(slot, QC_BURST);
		queue->timeout_us = interval_col(slot, QC_TIMEOUT);
		queue->key_rate = float_col(slot, QC_KEY_RATE);
		queue->key_burst = int_col(slot, QC_KEY_BURST);
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snap);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	return found;
}

bool
pgjq_storage_queue_get(const char *name, PgjqQueue *queue)
{
	HTAB	   *cache = queue_cache_get();
	CachedQueue *e;

	if (strlen(name) > PGJQ_MAX_QUEUE_NAME)
		return false;
	e = hash_search(cache, name, HASH_FIND, NULL);
	if (e)
	{
		*queue = e->queue;
		return true;
	}
	if (!queue_read(name, queue))
		return false;
	/* cache it unless an invalidation arrived while we read it */
	if (!queue_cache_stale)
	{
		e = hash_search(cache, name, HASH_ENTER, NULL);
		e->queue = *queue;
	}
	return true;
}

/* The queue, or raise undefined_object. */
void
pgjq_storage_queue_get_or_error(const char *name, PgjqQueue *queue)
{
	if (!pgjq_storage_queue_get(name, queue))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("queue \"%s\" does not exist", name)));
}

/* Fill values/nulls $2..$10 from settings (negative = NULL). */
static void
settings_params(const PgjqQueueSettings *s, Datum *values, char *nulls)
{
	int64		iv[] = {s->lease_us, -1, s->backoff_base_us, s->backoff_max_us, s->retention_us};

	for (int i = 0; i < 5; i++)
	{
		if (i == 1)
		{
			values[2] = Int32GetDatum(s->max_attempts);
			nulls[2] = s->max_attempts < 0 ? 'n' : ' ';
			continue;
		}
		values[i + 1] = iv[i] < 0 ? (Datum) 0 : pgjq_interval_datum(iv[i]);
		nulls[i + 1] = iv[i] < 0 ? 'n' : ' ';
	}
	values[6] = Int32GetDatum(s->concurrency);
	nulls[6] = s->concurrency < 0 ? 'n' : ' ';
	values[7] = Int32GetDatum(s->key_concurrency);
	nulls[7] = s->key_concurrency < 0 ? 'n' : ' ';
	values[8] = Float8GetDatum(s->rate);
	nulls[8] = s->rate < 0 ? 'n' : ' ';
	values[9] = Int32GetDatum(s->burst);
	nulls[9] = s->burst < 0 ? 'n' : ' ';
	values[10] = s->timeout_us < 0 ? (Datum) 0 : pgjq_interval_datum(s->timeout_us);
	nulls[10] = s->timeout_us < 0 ? 'n' : ' ';
	values[11] = Float8GetDatum(s->key_rate);
	nulls[11] = s->key_rate < 0 ? 'n' : ' ';
	values[12] = Int32GetDatum(s->key_burst);
	nulls[12] = s->key_burst < 0 ? 'n' : ' ';
}

bool
pgjq_storage_queue_insert(const char *name, const PgjqQueueSettings *s)
{
	Datum		values[13];
	char		nulls[14] = "             ";

	values[0] = CStringGetTextDatum(name);
	settings_params(s, values, nulls);
	pgjq_spi_run(&plan_insert, values, nulls, 0);
	queue_changed();
	return SPI_processed == 1;
}

void
pgjq_storage_queue_update(int32 queue_id, const PgjqQueueSettings *s)
{
	Datum		values[13];
	char		nulls[14] = "             ";

	values[0] = Int32GetDatum(queue_id);
	settings_params(s, values, nulls);
	pgjq_spi_run(&plan_update, values, nulls, 0);
	queue_changed();
}

void
pgjq_storage_queue_set_paused(int32 queue_id, bool paused)
{
	Datum		values[2] = {Int32GetDatum(queue_id), BoolGetDatum(paused)};

	pgjq_spi_run(&plan_set_paused, values, NULL, 0);
	queue_changed();
}

/*
 * Remove a queue and the rows of pgjq.job it has (waiting jobs, dedup
 * anchors), its held keys and dedup_for keys.  Its history stays until pruned: a dropped queue's history
 * counts as retention zero.  The ring's jobs of the queue are
 * pgjq_ring_drop_jobs's.
 */
void
pgjq_storage_queue_delete(int32 queue_id)
{
	Datum		values[1] = {Int32GetDatum(queue_id)};

	pgjq_spi_run(&plan_delete_jobs, values, NULL, 0);
	/* its jobs are gone: wait_jobs() callers look again */
	if (SPI_processed > 0)
		pgjq_wait_note_finished(0, 0);
	pgjq_spi_run(&plan_delete_holds, values, NULL, 0);
	pgjq_spi_run(&plan_delete, values, NULL, 0);
	queue_changed();
}

int64
pgjq_storage_queue_purge(int32 queue_id)
{
	Datum		values[1] = {Int32GetDatum(queue_id)};

	pgjq_spi_run(&plan_purge, values, NULL, 0);
	if (SPI_processed > 0)
		pgjq_wait_note_finished(0, 0);
	return (int64) SPI_processed;
}
