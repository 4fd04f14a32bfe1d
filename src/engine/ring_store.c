/*-------------------------------------------------------------------------
 *
 * ring_store.c
 *	  The ring engine's durable side and its operations: bodies appended to
 *	  the current slot (heap_insert, heap_multi_insert for batches, one btree
 *	  on id), one ring_log row per claim call and per call that ends claims,
 *	  bodies read back by position, slots truncated in ring order, and the
 *	  rebuild of shared memory from the tables after a start or a crash.
 *
 * Slots: pgjq.ring_body_N and pgjq.ring_log_N form slot N.  Producers append
 * to the current slot until it holds pgjq.ring_slot_rows bodies, then move to
 * the next one if it is clean (otherwise the current slot keeps growing).
 * Every row goes to the slot current when it is written, so a log row never
 * refers to a body in a newer slot.  A slot is truncated, body and log
 * together, only while it is the oldest slot in use (the one after the
 * current slot in ring order, or the next non-clean one after it), sealed,
 * with no unfinished job (open = 0) and no open transaction registered as
 * its writer; then every log row in it refers to a finished job in it.  The
 * truncating transaction holds AccessExclusiveLock on both tables (taken
 * without waiting); the slot is clean when it commits.
 *
 * Versions and the rebuild: a job's claim is the largest token logged for
 * its id ('c' rows, and every closing row, which implies its claim) that is
 * above the after_token of the job's newest body.  No such claim: ready.
 * That claim closed ('d', 'f' or 'x'): finished.  Otherwise in flight until
 * the latest lease of its 'c' and 'h' rows ('q': its cancellation was
 * requested): a job leased before a crash is not handed to
 * anyone else before that lease ends.  The rebuild scans the live slots in
 * full (about 1.5 microseconds per live body row, bench/spike/README.md) at
 * the first ring call of a database after a start, under ExclusiveLock on
 * pgjq.ring_log_0 so that concurrent first calls wait for it.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring.h"
#include "state/ring_internal.h"
#include "engine/storage_internal.h"
#include "state/limits.h"
#include "state/wait.h"
#include "state/worker_slots.h"
#include "common/args.h"
#include "api/maintenance.h"
#include "api/outcome.h"

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

#define MULTI_CHUNK 1000		/* heap_multi_insert batch, as COPY uses */

/* columns of a body (sql/pgjq.sql) */
#define B_ID		1
#define B_AFTER		2
#define B_QUEUE		3
#define B_ENQUEUED	4
#define B_ATTEMPT	5
#define B_MAX		6
#define B_PRIORITY	7
#define B_FAIRKEY	8
#define B_PAYLOAD	9
#define B_LASTERR	10
#define B_RUNAT		11
#define B_DEDUP		12
#define B_TIMEOUT	13
#define B_SCOPE		14
#define B_NATTS		14

/* relation OIDs of this database, looked up once per backend and database */
static Oid	cached_db = InvalidOid;
static Oid	body_oid[RING_NSLOTS];
static Oid	log_oid[RING_NSLOTS];
static Oid	jobseq_oid,
			tokseq_oid;

static void
lookup_oids(void)
{
	char		name[NAMEDATALEN];

	for (int i = 0; i < RING_NSLOTS; i++)
	{
		snprintf(name, sizeof(name), "ring_body_%d", i);
		body_oid[i] = pgjq_relation(name);
		snprintf(name, sizeof(name), "ring_log_%d", i);
		log_oid[i] = pgjq_relation(name);
		if (!OidIsValid(body_oid[i]) || !OidIsValid(log_oid[i]))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("the tables of pgjq's ring engine are missing"),
					 errhint("Update the extension: ALTER EXTENSION pgjq UPDATE.")));
	}
	jobseq_oid = pgjq_relation("job_id_seq");
	tokseq_oid = pgjq_relation("token_seq");
	cached_db = MyDatabaseId;
}

static void rebuild(void);
static void log_append_to(int s, int64 token, TimestampTz at, char kind, const int64 *ids, int n,
						  const char *worker, TimestampTz deadline, ItemPointer tid);
static bool standby_counts(int32 queue_id, int64 *ready, int64 *running, TimestampTz *oldest);
static bool standby_scan(void);
typedef struct StandbyCount
{
	int32		queue_id;		/* key */
	int64		ready;
	int64		running;
	TimestampTz oldest;
} StandbyCount;
static HTAB *sb_counts;

/* Are all ring tables of this database empty? */
static bool
rings_empty(void)
{
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	b = RelationIdGetRelation(body_oid[s]);
		Relation	l = RelationIdGetRelation(log_oid[s]);
		bool		empty = RelationIsValid(b) && RelationIsValid(l) &&
		RelationGetNumberOfBlocks(b) == 0 && RelationGetNumberOfBlocks(l) == 0;

		if (RelationIsValid(b))
			RelationClose(b);
		if (RelationIsValid(l))
			RelationClose(l);
		if (!empty)
			return false;
	}
	return true;
}

/*
 * Free the records of databases that no longer exist (pg_database is a
 * shared catalog, read without the lock).  A dropped database does not come
 * back; should its OID be reused, the new database's ring_body_0 has another
 * OID, so its first call would rebuild anyway.
 */
static void
forget_gone_databases(void)
{
	Oid		   *dbids = palloc(sizeof(Oid) * ring->ndbs);
	bool	   *gone = palloc0(sizeof(bool) * ring->ndbs);

	LWLockAcquire(ring->lock, LW_SHARED);
	for (int i = 0; i < ring->ndbs; i++)
		dbids[i] = ring->dbs[i].dbid;
	LWLockRelease(ring->lock);
	for (int i = 0; i < ring->ndbs; i++)
		gone[i] = OidIsValid(dbids[i]) &&
			!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i]));
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < ring->ndbs; i++)
		if (gone[i] && ring->dbs[i].dbid == dbids[i])
		{
			ring_clear_db(&ring->dbs[i]);
			memset(&ring->dbs[i], 0, sizeof(RingDb));
		}
	LWLockRelease(ring->lock);
}

/*
 * Before any ring operation: shared memory exists, this database has a
 * record, and it matches the tables (rebuilt at the first call after a
 * start, or when the extension was created again).  Returns false when
 * the ring cannot hold jobs here: reads during recovery (the ring's state
 * is not kept on a standby), or a schema without the ring's tables.
 */
static bool
ensure_ready(bool must)
{
	RingDb	   *db;
	bool		ok;

	pgjq_ring_require();
	/* a standby keeps no ring state; writes fail as read-only anyway */
	if (RecoveryInProgress())
		return false;
	/* the OIDs change when the extension is dropped and created again */
	if (cached_db != MyDatabaseId || pgjq_relation("ring_body_0") != body_oid[0])
	{
		/* a 0.1.0 schema under this library: no ring in this database */
		if (!OidIsValid(pgjq_relation("ring_body_0")))
		{
			if (must)
				lookup_oids();	/* raises */
			return false;
		}
		lookup_oids();
	}
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	LWLockRelease(ring->lock);
	if (db == NULL)
	{
		/* free the records of databases that were dropped, then look again */
		forget_gone_databases();
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
		db = ring_db();
		LWLockRelease(ring->lock);
	}
	if (db == NULL)
	{
		/* no record to spare: fine as long as this database has no ring job */
		if (!must && rings_empty())
			return false;
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine serves at most %d databases", ring->ndbs),
				 errhint("Raise pgjq.max_databases and restart the server.")));
	}
	LWLockAcquire(ring->lock, LW_SHARED);
	ok = db->ready && db->incarnation == body_oid[0];
	LWLockRelease(ring->lock);
	if (ok)
		return true;

	/*
	 * The first call after a start rebuilds; concurrent first calls wait for
	 * it on this lock, which nothing else takes in this mode, and then find
	 * the state ready.  No transaction has ring work in this database now:
	 * every ring call comes through here first.  Records of databases that
	 * were dropped go first: the rebuild may need their room.
	 */
	forget_gone_databases();
	LockRelationOid(log_oid[0], ExclusiveLock);
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	ok = db != NULL && db->ready && db->incarnation == body_oid[0];
	LWLockRelease(ring->lock);
	if (!ok)
		rebuild();
	UnlockRelationOid(log_oid[0], ExclusiveLock);
	return true;
}

/* ---------------------------------------------------------------------
 * slots
 * --------------------------------------------------------------------- */

/*
 * The slot to write to now, registering this transaction as its writer (so
 * it is not truncated before the transaction ends).  Appending bodies move
 * producers to the next slot once the current one is full and the next one
 * is clean; otherwise the current slot keeps growing.
 */
static int
slot_for_write(int appending)
{
	RingDb	   *db;
	int			s;
	bool		stalled = false;
	uint64		mark = 0;

	/* the xid before the lock: assigning one may do I/O */
	(void) GetTopTransactionId();
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	s = db->cur_slot;
	if (appending > 0 && db->slots[s].appended >= pgjq_ring_slot_rows)
	{
		int			nx = (s + 1) % RING_NSLOTS;

		if (db->slots[nx].clean)
		{
			db->slots[s].sealed = true;
			db->slots[nx].clean = false;
			db->slots[nx].gen = ++db->gen;
			db->slots[nx].marked = false;
			db->cur_slot = nx;
			s = nx;
		}
		else if (!db->stalled)
			stalled = db->stalled = true;
	}
	db->slots[s].appended += appending;
	if (ring_note_writer(s))
		db->slots[s].writers++;
	/* no committed 'g' row yet: this transaction writes one (current_slot) */
	if (!db->slots[s].marked && db->slots[s].gen != 0 && !ring_marker_written(s))
		mark = db->slots[s].gen;
	LWLockRelease(ring->lock);

	/*
	 * Every transaction that writes to a slot before one of its 'g' rows has
	 * committed writes one too, so no committed row of the slot is without a
	 * committed 'g' row of the slot's generation (once per slot and turn, a
	 * handful of rows at most).  The slot cannot be truncated meanwhile: this
	 * transaction is one of its writers.
	 */
	if (mark != 0)
	{
		log_append_to(s, (int64) mark, GetCurrentTimestamp(), 'g', NULL, 0, NULL, 0, NULL);
		ring_note_marker(s, mark);
	}

	/*
	 * The oldest slot still holds unfinished jobs: the worker relocates them
	 * (if they are a few stragglers) once this commits, not at its next pass
	 */
	if (stalled)
		pgjq_shmem_note_due(GetCurrentTimestamp());
	return s;
}

/*
 * Truncate the oldest slot in use if it is sealed and all its jobs are
 * finished, in the caller's transaction (one per transaction).  Never waits
 * for a lock: a slot someone still reads is tried again by a later call.
 */
static bool
maybe_truncate(void)
{
	RingDb	   *db;
	int			s = -1;
	char		sql[96];
	TransactionId horizon = InvalidTransactionId;

	if (ring_truncating())
		return false;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	for (int k = 1; k < RING_NSLOTS; k++)
	{
		int			c = (db->cur_slot + k) % RING_NSLOTS;
		RingSlot   *st = &db->slots[c];

		if (st->clean)
			continue;
		/* the oldest in use: truncatable or nothing is */
		if (st->sealed && st->open == 0 && st->writers == 0 && !st->truncating)
		{
			/*
			 * TRUNCATE is not MVCC-safe: a snapshot taken before the slot's
			 * last job finished would find its body gone and the job in no
			 * store at all (job(id) of a REPEATABLE READ transaction).  So
			 * the slot waits until every snapshot is newer than that, as
			 * vacuum waits for the horizon.  Computed at most once a call,
			 * only for a slot that is otherwise ready.
			 */
			if (TransactionIdIsValid(st->left_xid))
			{
				if (!TransactionIdIsValid(horizon))
				{
					LWLockRelease(ring->lock);
					horizon = GetOldestNonRemovableTransactionId(NULL);
					LWLockAcquire(ring->lock, LW_EXCLUSIVE);
					db = ring_db();
					k = 0;		/* look again: it may have changed */
					continue;
				}
				if (!TransactionIdPrecedes(st->left_xid, horizon))
					break;
			}
			st->truncating = true;
			s = c;
		}
		break;
	}
	LWLockRelease(ring->lock);
	if (s < 0)
		return false;
	/* from here the abort callback clears the flag */
	ring_note_truncating(s);
	if (!ConditionalLockRelationOid(body_oid[s], AccessExclusiveLock) ||
		!ConditionalLockRelationOid(log_oid[s], AccessExclusiveLock))
	{
		/* the lock taken is kept to the end of the transaction: harmless */
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
		ring_db()->slots[s].truncating = false;
		LWLockRelease(ring->lock);
		ring_note_truncating(-1);
		return false;
	}
	/* rare (once per slot): the catalog work is TRUNCATE's */
	snprintf(sql, sizeof(sql), "TRUNCATE pgjq.ring_body_%d, pgjq.ring_log_%d", s, s);
	pgjq_spi_exec_utility(sql);
	return true;
}

/*
 * A claim's or a completion's turn at maybe_truncate: only in a transaction
 * of its own statement.  The slot's ACCESS EXCLUSIVE lock lasts to the end
 * of the transaction, and in a client's transaction block it would block
 * every reader of the slot (job(id), cancel, verify) until the client
 * commits; a block is also what PREPARE TRANSACTION needs, which a
 * truncation refuses.  The worker's "ring space" step truncates in any case.
 */
static void
client_truncate(void)
{
	RingDb	   *db;
	TimestampTz now;
	bool		wake = false;

	if (!IsTransactionBlock())
	{
		(void) maybe_truncate();
		return;
	}

	/*
	 * In a block: the worker truncates, woken now (at most every 100 ms) if
	 * the oldest slot in use looks finished, so that claims in blocks give
	 * space back about as soon as claims in statements of their own do. Not
	 * at commit: that would refuse PREPARE of an empty claim.
	 */
	now = GetCurrentTimestamp();
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	for (int k = 1; db != NULL && k < RING_NSLOTS; k++)
	{
		RingSlot   *st = &db->slots[(db->cur_slot + k) % RING_NSLOTS];

		if (st->clean)
			continue;
		wake = st->sealed && st->open == 0 && st->writers == 0 && !st->truncating &&
			now - db->truncate_woken >= 100 * 1000;
		break;
	}
	LWLockRelease(ring->lock);
	if (!wake)
		return;
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db_find();
	wake = db != NULL && now - db->truncate_woken >= 100 * 1000;
	if (wake)
		db->truncate_woken = now;
	LWLockRelease(ring->lock);
	if (wake)
		pgjq_shmem_wake_worker();
}

/* ---------------------------------------------------------------------
 * rows
 * --------------------------------------------------------------------- */
typedef struct BodyRow
{
	int64		id;
	int64		after;
	int32		queue_id;
	TimestampTz enqueued_at;
	int32		attempt;
	int32		max_attempts;
	int16		priority;
	Datum		fair_key;		/* text or 0 */
	Datum		payload;
	Datum		last_error;		/* text or 0 */
	TimestampTz run_at;			/* 0: enqueued_at */
	Datum		dedup_key;		/* text or 0: it has an anchor in pgjq.job */
	int64		timeout_us;		/* its own execution deadline; 0: the queue's */
	char		dedup_scope;	/* 'w': its claim deletes the anchor; 0: its
								 * end */
	TransactionId xmin;			/* body_by_id only: who wrote it */
} BodyRow;

/*
 * Whether a job with this body has its dedup anchor in pgjq.job while it
 * runs: a 'waiting' key went with its claim.
 */
#define BODY_ANCHORED_RUNNING(b) ((b)->dedup_key != (Datum) 0 && (b)->dedup_scope != 'w')

static bool standby_job(int64 id, char *state, TimestampTz *lease, char **worker, bool *cancel,
						BodyRow *b);
static void anchors_end(int n, const int64 *ids);

static void
body_values(const BodyRow *b, Datum *values, bool *nulls)
{
	values[B_ID - 1] = Int64GetDatum(b->id);
	nulls[B_ID - 1] = false;
	values[B_AFTER - 1] = Int64GetDatum(b->after);
	nulls[B_AFTER - 1] = b->after == 0;
	values[B_QUEUE - 1] = Int32GetDatum(b->queue_id);
	nulls[B_QUEUE - 1] = false;
	values[B_ENQUEUED - 1] = TimestampTzGetDatum(b->enqueued_at);
	nulls[B_ENQUEUED - 1] = false;
	values[B_ATTEMPT - 1] = Int32GetDatum(b->attempt);
	nulls[B_ATTEMPT - 1] = b->attempt == 1;
	values[B_MAX - 1] = Int32GetDatum(b->max_attempts);
	nulls[B_MAX - 1] = false;
	values[B_PRIORITY - 1] = Int16GetDatum(b->priority);
	nulls[B_PRIORITY - 1] = b->priority == 0;
	values[B_FAIRKEY - 1] = b->fair_key;
	nulls[B_FAIRKEY - 1] = b->fair_key == (Datum) 0;
	values[B_PAYLOAD - 1] = b->payload;
	nulls[B_PAYLOAD - 1] = false;
	values[B_LASTERR - 1] = b->last_error;
	nulls[B_LASTERR - 1] = b->last_error == (Datum) 0;
	values[B_RUNAT - 1] = TimestampTzGetDatum(b->run_at);
	nulls[B_RUNAT - 1] = b->run_at == 0;
	values[B_DEDUP - 1] = b->dedup_key;
	nulls[B_DEDUP - 1] = b->dedup_key == (Datum) 0;
	values[B_TIMEOUT - 1] = b->timeout_us > 0 ? pgjq_interval_datum(b->timeout_us) : (Datum) 0;
	nulls[B_TIMEOUT - 1] = b->timeout_us <= 0;
	values[B_SCOPE - 1] = CharGetDatum(b->dedup_scope);
	nulls[B_SCOPE - 1] = b->dedup_scope == 0;
}

/* A body row's fields; payload and key detoasted copies in the current context. */
static void
body_read(HeapTuple tup, TupleDesc desc, BodyRow *b)
{
	bool		isnull;
	Datum		d;

	b->id = DatumGetInt64(heap_getattr(tup, B_ID, desc, &isnull));
	d = heap_getattr(tup, B_AFTER, desc, &isnull);
	b->after = isnull ? 0 : DatumGetInt64(d);
	b->queue_id = DatumGetInt32(heap_getattr(tup, B_QUEUE, desc, &isnull));
	b->enqueued_at = DatumGetTimestampTz(heap_getattr(tup, B_ENQUEUED, desc, &isnull));
	d = heap_getattr(tup, B_ATTEMPT, desc, &isnull);
	b->attempt = isnull ? 1 : DatumGetInt32(d);
	b->max_attempts = DatumGetInt32(heap_getattr(tup, B_MAX, desc, &isnull));
	d = heap_getattr(tup, B_PRIORITY, desc, &isnull);
	b->priority = isnull ? 0 : DatumGetInt16(d);
	d = heap_getattr(tup, B_FAIRKEY, desc, &isnull);
	b->fair_key = isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
	b->payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(heap_getattr(tup, B_PAYLOAD, desc, &isnull)));
	d = heap_getattr(tup, B_LASTERR, desc, &isnull);
	b->last_error = isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
	d = heap_getattr(tup, B_RUNAT, desc, &isnull);
	b->run_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = heap_getattr(tup, B_DEDUP, desc, &isnull);
	b->dedup_key = isnull ? (Datum) 0 : PointerGetDatum(PG_DETOAST_DATUM_COPY(d));
	/* a table without the column (never past its descriptor): none */
	b->timeout_us = 0;
	if (desc->natts >= B_TIMEOUT)
	{
		d = heap_getattr(tup, B_TIMEOUT, desc, &isnull);
		if (!isnull)
			b->timeout_us = pgjq_interval_usec(DatumGetIntervalP(d));
	}
	b->dedup_scope = 0;
	if (desc->natts >= B_SCOPE)
	{
		d = heap_getattr(tup, B_SCOPE, desc, &isnull);
		if (!isnull)
			b->dedup_scope = DatumGetChar(d);
	}
}

/* The body at a published position (no MVCC test: publication proves it). */
static void
body_fetch(Relation rel, int64 id, ItemPointer tid, BodyRow *b)
{
	HeapTupleData tup;
	Buffer		buf;

	tup.t_self = *tid;
	if (!heap_fetch(rel, SnapshotAny, &tup, &buf, false))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the body of job " INT64_FORMAT " is missing", id)));
	body_read(&tup, RelationGetDescr(rel), b);
	ReleaseBuffer(buf);
	if (b->id != id)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the position of job " INT64_FORMAT " holds job " INT64_FORMAT,
						id, b->id)));
}

/* the lane key of a body */
static void
body_lane_key(const BodyRow *b, RingLaneKey *k)
{
	text	   *t = b->fair_key ? DatumGetTextPP(b->fair_key) : NULL;

	ring_lane_key(k, b->queue_id, b->priority, t ? VARDATA_ANY(t) : NULL,
				  t ? VARSIZE_ANY_EXHDR(t) : 0);
}

/*
 * Append n bodies to slot s (heap_insert for one, heap_multi_insert for
 * more, then the id index), their positions into tids.
 */
static void
body_append(int s, int n, const BodyRow *rows, ItemPointerData *tids)
{
	Relation	rel = table_open(body_oid[s], RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	CommandId	cid = GetCurrentCommandId(true);
	List	   *idxoids = RelationGetIndexList(rel);
	ListCell   *lc;

	if (n == 1)
	{
		Datum		values[B_NATTS];
		bool		nulls[B_NATTS];
		HeapTuple	tup;

		body_values(&rows[0], values, nulls);
		tup = heap_form_tuple(desc, values, nulls);
		heap_insert(rel, tup, cid, 0, NULL);
		tids[0] = tup->t_self;
		heap_freetuple(tup);
	}
	else
	{
		int			chunk = Min(n, MULTI_CHUNK);
		TupleTableSlot **slots = palloc(sizeof(TupleTableSlot *) * chunk);
		BulkInsertState bistate = GetBulkInsertState();

		for (int i = 0; i < chunk; i++)
			slots[i] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
		for (int done = 0; done < n; done += chunk)
		{
			int			m = Min(chunk, n - done);

			for (int i = 0; i < m; i++)
			{
				Datum		values[B_NATTS];
				bool		nulls[B_NATTS];

				body_values(&rows[done + i], values, nulls);
				ExecStoreHeapTuple(heap_form_tuple(desc, values, nulls), slots[i], true);
			}
			heap_multi_insert(rel, slots, m, cid, 0, bistate);
			for (int i = 0; i < m; i++)
			{
				tids[done + i] = slots[i]->tts_tid;
				ExecClearTuple(slots[i]);
			}
		}
		for (int i = 0; i < chunk; i++)
			ExecDropSingleTupleTableSlot(slots[i]);
		FreeBulkInsertState(bistate);
	}

	/* the id index (the only index pgjq puts on a body) */
	foreach(lc, idxoids)
	{
		Relation	idx = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *ii = BuildIndexInfo(idx);

		if (ii->ii_NumIndexAttrs != 1 || ii->ii_IndexAttrNumbers[0] != B_ID ||
			ii->ii_Expressions != NIL || ii->ii_Predicate != NIL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("an index on %s other than on id is not supported",
							RelationGetRelationName(rel))));
		for (int i = 0; i < n; i++)
		{
			Datum		v = Int64GetDatum(rows[i].id);
			bool		isnull = false;

			index_insert(idx, &v, &isnull, &tids[i], rel, UNIQUE_CHECK_NO, false, ii);
		}
		index_close(idx, NoLock);
	}
	table_close(rel, NoLock);
}

static ArrayType *
int8_array(const int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return construct_array(d, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

/* columns of a log row (sql/pgjq.sql) */
#define L_TOKEN		1
#define L_AT		2
#define L_KIND		3
#define L_IDS		4
#define L_WORKER	5
#define L_DEADLINE	6
#define L_NATTS		6

/*
 * One ring_log row into slot s; worker and deadline only for claims ('c'),
 * NULL and 0 for none.  Its position goes to *tid when tid is given.
 */
static void
log_append_to(int s, int64 token, TimestampTz at, char kind, const int64 *ids, int n,
			  const char *worker, TimestampTz deadline, ItemPointer tid)
{
	Relation	rel = table_open(log_oid[s], RowExclusiveLock);
	Datum		values[L_NATTS];
	bool		nulls[L_NATTS] = {false, false, false, false, worker == NULL, deadline == 0};
	HeapTuple	tup;

	values[L_TOKEN - 1] = Int64GetDatum(token);
	values[L_AT - 1] = TimestampTzGetDatum(at);
	values[L_KIND - 1] = CharGetDatum(kind);
	values[L_IDS - 1] = PointerGetDatum(int8_array(ids, n));
	values[L_WORKER - 1] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
	values[L_DEADLINE - 1] = TimestampTzGetDatum(deadline);
	tup = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	simple_heap_insert(rel, tup);
	if (tid)
		*tid = tup->t_self;
	heap_freetuple(tup);
	table_close(rel, NoLock);
}

/* One ring_log row into the current slot (all kinds but claims). */
static void
log_append(int64 token, TimestampTz at, char kind, const int64 *ids, int n)
{
	log_append_to(slot_for_write(0), token, at, kind, ids, n, NULL, 0, NULL);
}

/*
 * The worker named by the claim row at (slot, tid), if it is the 'c' row of
 * `token` (in the current memory context); NULL when it names none or the
 * row is not that claim's any more (its slot was truncated).  For job(id)
 * and relocation; the caller holds no ring lock.
 */
static char *
claim_worker(int slot, ItemPointer tid, int64 token)
{
	Relation	rel;
	HeapTupleData tup;
	Buffer		buf;
	char	   *worker = NULL;

	if (slot < 0 || slot >= RING_NSLOTS || !ItemPointerIsValid(tid))
		return NULL;
	rel = table_open(log_oid[slot], AccessShareLock);
	tup.t_self = *tid;
	if (ItemPointerGetBlockNumber(tid) < RelationGetNumberOfBlocks(rel) &&
		heap_fetch(rel, SnapshotAny, &tup, &buf, false))
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		int64		t = DatumGetInt64(heap_getattr(&tup, L_TOKEN, desc, &isnull));
		char		kind = DatumGetChar(heap_getattr(&tup, L_KIND, desc, &isnull));
		Datum		w = heap_getattr(&tup, L_WORKER, desc, &isnull);

		if (t == token && kind == 'c' && !isnull)
			worker = TextDatumGetCString(w);
		ReleaseBuffer(buf);
	}
	table_close(rel, AccessShareLock);
	return worker;
}

/* log rows of closed claims, one per distinct token (usually one) */
static void
log_closes(char kind, TimestampTz at, int n, const int64 *ids, const int64 *toks)
{
	int64	   *grp = palloc(sizeof(int64) * n);
	bool	   *done = palloc0(sizeof(bool) * n);

	for (int i = 0; i < n; i++)
	{
		int			m = 0;

		if (done[i])
			continue;
		for (int j = i; j < n; j++)
			if (!done[j] && toks[j] == toks[i])
			{
				grp[m++] = ids[j];
				done[j] = true;
			}
		log_append(toks[i], at, kind, grp, m);
	}
}

/* ---------------------------------------------------------------------
 * enqueue
 * --------------------------------------------------------------------- */
/*
 * Append n bodies of one queue to the current slot and publish them when
 * the transaction commits: room for their positions is reserved and their
 * lanes pinned now, so that the commit callback cannot fail; a bound that
 * is reached raises here, before anything is published.  For enqueue and
 * for the promotion of due jobs from pgjq.job.
 */
static void
append_and_publish(int32 queue_id, int n, BodyRow *rows)
{
	ItemPointerData *tids = palloc(sizeof(ItemPointerData) * n);
	RingLaneKey *keys = palloc(sizeof(RingLaneKey) * n);
	RingLane  **lanes = palloc(sizeof(RingLane *) * n);
	int			s;
	int			pinned = 0;
	const char *full = NULL;

	for (int i = 0; i < n; i++)
		body_lane_key(&rows[i], &keys[i]);
	s = slot_for_write(n);
	body_append(s, n, rows, tids);

	/* room for the positions, and their lanes pinned: the commit cannot fail */
	ring_reserve_local(n, 0, 0);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	if (ring->count + ring->reserved + ring->held + n > pgjq_ring_positions)
		full = "positions";
	else
	{
		RingQueue  *q = ring_queue_get(queue_id, true);

		if (q == NULL)
			full = "queues";
		for (int i = 0; i < n && full == NULL; i++)
		{
			if (i > 0 && memcmp(&keys[i], &keys[i - 1], sizeof(RingLaneKey)) == 0)
				lanes[i] = lanes[i - 1];
			else if ((lanes[i] = ring_lane_get(&keys[i], q)) == NULL)
			{
				full = "lanes";
				break;
			}
			lanes[i]->pinned++;
			pinned++;
		}
	}
	if (full != NULL)
	{
		for (int i = 0; i < pinned; i++)
		{
			lanes[i]->pinned--;
			ring_lane_settle(lanes[i]);
		}
		LWLockRelease(ring->lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more %s", full),
				 errdetail("pgjq.ring_positions = %d, pgjq.ring_max_lanes = %d, pgjq.ring_max_queues = %d.",
						   pgjq_ring_positions, pgjq_ring_max_lanes, pgjq_ring_max_queues),
				 errhint("Raise the setting and restart the server, or let workers drain the ring queues.")));
	}
	ring->reserved += n;
	for (int i = 0; i < n; i++)
	{
		RingPos		p;

		p.id = rows[i].id;
		p.enqueued_at = rows[i].enqueued_at;
		p.tid = tids[i];
		p.slot = s;
		ring_note_enqueued(&p, lanes[i]);
	}
	LWLockRelease(ring->lock);
	/* waiting claims wake when this commits (wait.c) */
	pgjq_wait_note_ready(queue_id, n);
}

bool
pgjq_ring_has_room(int n)
{
	int64		used;

	if (ring == NULL)
		return true;
	LWLockAcquire(ring->lock, LW_SHARED);
	used = (int64) ring->count + ring->reserved + ring->held;
	LWLockRelease(ring->lock);
	return used + n + pgjq_ring_positions / 16 <= pgjq_ring_positions;
}

/*
 * Jobs due now into the ring.  Jobs with a dedup_key first insert their
 * anchor into pgjq.job (pgjq_storage_enqueue with jobs->anchors: the unique
 * index decides, with ON CONFLICT, exactly as for a job of pgjq.job), and
 * only the positions that made a new anchor are appended, under the ids
 * drawn there; the others got the existing job's id.
 */
void
pgjq_ring_enqueue(int32 queue_id, int32 max_attempts, PgjqNewJobs *jobs)
{
	int			n = jobs->n;
	BodyRow    *rows = palloc(sizeof(BodyRow) * n);
	bool		keyed = false;
	bool	   *created = NULL;
	int			m = 0;

	if (n == 0)
		return;
	if (!ensure_ready(true))
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot use a ring queue during recovery")));
	for (int i = 0; keyed == false && jobs->dedup_keys != NULL && i < n; i++)
		keyed = !jobs->dedup_key_nulls[i];
	if (keyed)
	{
		/* the anchors of the positions with a key, as a call of their own */
		PgjqNewJobs a = *jobs;
		int		   *pos = palloc(sizeof(int) * n);
		int			k = 0;

		a.ids = palloc(sizeof(int64) * n);
		a.payloads = palloc(sizeof(Datum) * n);
		a.fair_keys = palloc(sizeof(Datum) * n);
		a.fair_key_nulls = palloc(sizeof(bool) * n);
		a.dedup_keys = palloc(sizeof(Datum) * n);
		a.dedup_key_nulls = palloc0(sizeof(bool) * n);
		a.created = palloc0(sizeof(bool) * n);
		a.anchors = true;
		for (int i = 0; i < n; i++)
		{
			if (jobs->dedup_key_nulls[i])
				continue;
			a.payloads[k] = jobs->payloads[i];
			a.fair_key_nulls[k] = !jobs->fair_keys || jobs->fair_key_nulls[i];
			a.fair_keys[k] = a.fair_key_nulls[k] ? (Datum) 0 : jobs->fair_keys[i];
			a.dedup_keys[k] = jobs->dedup_keys[i];
			pos[k++] = i;
		}
		a.n = k;
		pgjq_storage_enqueue(queue_id, &a);
		created = palloc(sizeof(bool) * n);
		for (int i = 0; i < n; i++)
			created[i] = jobs->dedup_key_nulls[i];
		for (int j = 0; j < k; j++)
		{
			jobs->ids[pos[j]] = a.ids[j];
			created[pos[j]] = a.created[j];
		}
	}
	if (jobs->created)
		for (int i = 0; i < n; i++)
			jobs->created[i] = !keyed || created[i];
	for (int i = 0; i < n; i++)
	{
		BodyRow    *b = &rows[m];

		if (keyed && !created[i])
			continue;
		if ((keyed && !jobs->dedup_key_nulls[i]) || jobs->ids_given)
			b->id = jobs->ids[i];
		else
		{
			b->id = nextval_internal(jobseq_oid, false);
			jobs->ids[i] = b->id;
		}
		b->after = 0;
		b->queue_id = queue_id;
		b->enqueued_at = jobs->enqueued_at;
		b->attempt = 1;
		b->max_attempts = max_attempts;
		b->priority = jobs->priority;
		b->fair_key = (jobs->fair_keys && !jobs->fair_key_nulls[i] &&
					   VARSIZE_ANY_EXHDR(DatumGetPointer(jobs->fair_keys[i])) > 0)
			? jobs->fair_keys[i] : (Datum) 0;
		b->payload = jobs->payloads[i];
		b->last_error = (Datum) 0;
		b->run_at = 0;
		b->dedup_key = keyed && !jobs->dedup_key_nulls[i] ? jobs->dedup_keys[i] : (Datum) 0;
		b->dedup_scope = b->dedup_key ? jobs->dedup_scope : 0;
		b->timeout_us = jobs->timeout_us;
		m++;
	}
	if (m > 0)
		append_and_publish(queue_id, m, rows);
}

/* ---------------------------------------------------------------------
 * promotion: due jobs of ring queues from pgjq.job into the ring
 * --------------------------------------------------------------------- */

/*
 * The due scheduled jobs of ring queues, the earliest first; locked rows are
 * skipped.  With the xmin of each, then taken out of pgjq.job by id, ordered
 * by queue for append_and_publish: deleted, or for a job with a dedup_key
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

	values[0] = PointerGetDatum(int8_array(ids, n));
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
		append_and_publish(rows[a].queue_id, z - a, rows + a);
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

	if (ring == NULL || n <= 0 || !ensure_ready(false))
		return 0;
	if (promote_room(n) < n)
		return 0;
	values[0] = PointerGetDatum(int8_array((int64 *) ids, n));
	pgjq_spi_run(&plan_promote_waiting_pick, values, NULL, 0);
	return promote_picked();
}

int64
pgjq_ring_promote(TimestampTz now, int limit)
{
	Datum		values[2];

	if (ring == NULL || limit <= 0 || !ensure_ready(false))
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
	if (ring == NULL || limit <= 0 || !ensure_ready(false))
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

/* ---------------------------------------------------------------------
 * claim
 * --------------------------------------------------------------------- */
static int
u64_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return (x > y) - (x < y);
}

static int64
next_token(int64 *token)
{
	if (*token == 0)
		*token = nextval_internal(tokseq_oid, false);
	return *token;
}

int
pgjq_ring_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
				const char *worker, PgjqClaimQuota *quota, int64 *token,
				PgjqClaimedJob *jobs)
{
	RingPos    *got;
	int64	   *gotids;
	uint64	   *gothash;		/* limits.c's hash of each job's key */
	bool	   *anchored;
	int			k = 0;
	int64		tok;
	TransactionId xid;
	RingQueue  *q;
	bool		any;
	Relation	rels[RING_NSLOTS] = {NULL};
	MemoryContext old;
	bool		in_flight_full = false;
	bool		counters_full = false;
	bool		key_limited = queue->key_concurrency > 0;
	bool		key_rated = queue->key_rate > 0;
	bool		rates_full = false;
	bool		held;
	int			claim_slot;
	ItemPointerData *claim_tids;
	TimestampTz deadline = 0;
	TimestampTz *deadlines;
	TimestampTz lease_asked;
	TimestampTz claimed_at;
	bool	   *done;
	int64	   *waiting_keys;	/* jobs whose 'waiting' dedup_key the claim
								 * frees */
	int			nwaiting = 0;

	if (!ensure_ready(true))
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot use a ring queue during recovery")));
	/* the queue's execution deadline: no lease of these jobs goes past it */
	lease_asked = lease_until;
	claimed_at = GetCurrentTimestamp();
	if (queue->timeout_us > 0)
	{
		deadline = claimed_at + queue->timeout_us;
		lease_until = Min(lease_until, deadline);
	}
	client_truncate();
	/* holds that ended give their keys' lanes back first (key_hold.c) */
	ring_holds_expire_due();
	/* and keys at their key_rate whose next token is due (key_rate.c) */
	ring_rates_expire_due();
	/* an empty poll draws no token and writes nothing */
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue->queue_id, false);
	any = q != NULL && (ring_queue_claimable(q) || ring_has_own(queue->queue_id));
	/* ready jobs, all of keys at their limit: held back, as on pgjq.job */
	held = !any && q != NULL && q->ready > 0 && key_limited;
	/* ready jobs, all of keys out until their next token */
	quota->key_rate_cut = !any && q != NULL && q->ready > 0 && key_rated;
	LWLockRelease(ring->lock);
	if (held && !quota->key_rate_cut)
		pgjq_limits_quota_held(quota);
	if (!any)
		return 0;
	/* a key limit counts each job under the ring's lock: room before it */
	if (key_limited)
		pgjq_limits_reserve_room(batch);

	xid = GetTopTransactionId();
	tok = next_token(token);
	got = palloc(sizeof(RingPos) * batch);
	gotids = palloc(sizeof(int64) * batch);
	gothash = palloc(sizeof(uint64) * batch);
	anchored = palloc(sizeof(bool) * batch);
	deadlines = palloc(sizeof(TimestampTz) * batch);
	claim_tids = palloc(sizeof(ItemPointerData) * batch);
	waiting_keys = palloc(sizeof(int64) * batch);
	ring_reserve_local(0, batch, 0);

	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue->queue_id, false);
	while (q != NULL && k < batch)
	{
		RingLane   *l = ring_next_lane(q);
		RingFlight *f;
		RingPos		p;

		if (l == NULL)
			break;
		f = ring_flight_enter(ring->nodes[l->head].p.id);
		if (f == NULL)
		{
			in_flight_full = true;	/* claim fewer, or say why none */
			break;
		}
		if (key_rated)
		{
			/* its key's bucket: without a token, out until the next one */
			int			r = ring_rate_take(queue, l->key.keyhash, GetCurrentTimestamp());

			if (r != 1)
			{
				ring_flight_remove(ring->nodes[l->head].p.id);
				rates_full = r == -1;
				quota->key_rate_cut = true;
				/* never the same lane again in this loop */
				if (r == 0 && !l->linked)
					continue;
				break;
			}
		}
		if (key_limited)
		{
			/*
			 * Its key at key_concurrency: out of the ring until one of its
			 * jobs ends (pgjq_ring_keys_freed), so the next claim does not
			 * look at it again: O(batch) however many keys are full.
			 */
			int			r = pgjq_limits_ring_key_take(quota, ring_limits_hash(l->key.keyhash));

			if (r != 1)
			{
				ring_flight_remove(ring->nodes[l->head].p.id);
				if (r == 0)
				{
					ring_lane_park(l);
					continue;
				}
				/* -1: no counter entry free; -2: keys not countable now */
				counters_full = r == -1;
				break;
			}
		}
		if (key_rated)
			ring_rate_spend(queue, l->key.keyhash);
		ring_lane_pop_front(l, &p);
		l->running++;
		q->running++;
		f->token = tok;
		f->lease_until = lease_until;
		f->deadline = deadline;
		f->pending = false;
		f->enqueued_at = p.enqueued_at;
		f->xid = xid;
		f->tid = p.tid;
		f->slot = p.slot;
		f->state = RF_CLAIMING;
		f->attempt = 1;
		f->queue_id = queue->queue_id;
		f->lane = l;
		ring_lane_settle(l);
		ring->held++;
		got[k] = p;
		gotids[k] = p.id;
		gothash[k] = ring_limits_hash(l->key.keyhash);
		ring_claim_begun(f);
		ring_note_claimed(p.id);
		k++;
	}
	/* then this transaction's own jobs, which no other claim can see */
	if (q != NULL && k < batch)
	{
		RingPos    *own = palloc(sizeof(RingPos) * (batch - k));
		RingLane  **lanes = palloc(sizeof(RingLane *) * (batch - k));
		int			nown;

		nown = ring_take_own(queue->queue_id, batch - k, own, lanes);
		for (int i = 0; i < nown; i++)
		{
			RingFlight *f = ring_flight_enter(own[i].id);
			int			r = 1;

			int			rr = 1;

			if (f != NULL && key_rated)
			{
				rr = ring_rate_take(queue, lanes[i]->key.keyhash, GetCurrentTimestamp());
				if (rr != 1)
					ring_flight_remove(own[i].id);
			}
			if (f != NULL && rr == 1 && key_limited)
			{
				r = pgjq_limits_ring_key_take(quota, ring_limits_hash(lanes[i]->key.keyhash));
				if (r != 1)
					ring_flight_remove(own[i].id);
			}
			if (f == NULL || r != 1 || rr != 1)
			{
				/* give the rest back: they stay pending */
				ring_take_own_undo(own + i, nown - i);
				in_flight_full = f == NULL;
				counters_full = r == -1;
				rates_full = rr == -1;
				break;
			}
			if (key_rated)
				ring_rate_spend(queue, lanes[i]->key.keyhash);
			lanes[i]->running++;
			q->running++;
			f->token = tok;
			f->lease_until = lease_until;
			f->deadline = deadline;
			f->pending = true;
			f->enqueued_at = own[i].enqueued_at;
			f->xid = xid;
			f->tid = own[i].tid;
			f->slot = own[i].slot;
			f->state = RF_CLAIMING;
			f->attempt = 1;
			f->queue_id = queue->queue_id;
			f->lane = lanes[i];
			got[k] = own[i];
			gotids[k] = own[i].id;
			gothash[k] = ring_limits_hash(lanes[i]->key.keyhash);
			ring_claim_begun(f);
			ring_note_claimed(own[i].id);
			k++;
		}
	}
	LWLockRelease(ring->lock);
	if (counters_full)
		pgjq_limits_counters_full();
	if (k == 0 && rates_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more rate-limited keys (%d)",
						pgjq_ring_max_rate_keys),
				 errhint("Raise pgjq.ring_max_rate_keys and restart the server.")));
	if (k == 0 && in_flight_full)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine has no room for more running jobs (%d)",
						pgjq_ring_max_in_flight),
				 errhint("Complete running jobs, or raise pgjq.ring_max_in_flight and restart the server.")));
	if (k == 0)
		return 0;
	/* without a key limit, the keys count as pgjq.job's claims count them */
	pgjq_limits_ring_settle(queue, k, gothash);

	old = MemoryContextSwitchTo(pgjq_result_cxt);
	for (int i = 0; i < k; i++)
	{
		BodyRow		b;

		if (rels[got[i].slot] == NULL)
			rels[got[i].slot] = table_open(body_oid[got[i].slot], AccessShareLock);
		body_fetch(rels[got[i].slot], got[i].id, &got[i].tid, &b);
		jobs[i].id = b.id;
		jobs[i].token = tok;
		jobs[i].lease_until = lease_until;
		jobs[i].attempt = b.attempt;
		jobs[i].payload = b.payload;
		jobs[i].fair_key = b.fair_key;
		jobs[i].priority = b.priority;
		jobs[i].enqueued_at = b.enqueued_at;
		anchored[i] = BODY_ANCHORED_RUNNING(&b);
		if (b.dedup_key != (Datum) 0 && b.dedup_scope == 'w')
			waiting_keys[nwaiting++] = b.id;
		/* a job's own timeout replaces the queue's: its own deadline */
		deadlines[i] = deadline;
		if (b.timeout_us > 0)
		{
			deadlines[i] = claimed_at + b.timeout_us;
			jobs[i].lease_until = Min(lease_asked, deadlines[i]);
		}
	}
	MemoryContextSwitchTo(old);
	for (int s = 0; s < RING_NSLOTS; s++)
		if (rels[s])
			table_close(rels[s], NoLock);

	/*
	 * The claim's durable row: one, unless jobs with their own timeout have
	 * other deadlines than the rest (then one per deadline, each with its
	 * lease)
	 */
	claim_slot = slot_for_write(0);
	done = palloc0(sizeof(bool) * k);
	for (int i = 0; i < k; i++)
	{
		int			m = 0;

		if (done[i])
			continue;
		for (int j = i; j < k; j++)
			if (!done[j] && deadlines[j] == deadlines[i])
			{
				gotids[m++] = jobs[j].id;
				done[j] = true;
			}
		log_append_to(claim_slot, tok, jobs[i].lease_until, 'c', gotids, m, worker, deadlines[i],
					  &claim_tids[i]);
		for (int j = i + 1; j < k; j++)
			if (deadlines[j] == deadlines[i])
				claim_tids[j] = claim_tids[i];
	}
	/* a key held only while the job waited is free from this claim on */
	anchors_end(nwaiting, waiting_keys);

	/* what complete needs for the history, without reading the body again */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < k; i++)
	{
		RingFlight *f = ring_flight_find(jobs[i].id);

		if (f != NULL)
		{
			f->attempt = jobs[i].attempt;
			f->enqueued_at = jobs[i].enqueued_at;
			f->anchored = anchored[i];
			f->claim_tid = claim_tids[i];
			f->claim_slot = (uint16) claim_slot;
			f->lease_until = jobs[i].lease_until;
			f->deadline = deadlines[i];
		}
	}
	LWLockRelease(ring->lock);
	return k;
}

bool
pgjq_ring_table_first(int32 queue_id, uint64 *gen)
{
	RingQueue  *q;
	bool		maybe = true;

	*gen = 0;
	if (ring == NULL)
		return true;
	/* this transaction made table jobs of the queue ready: it sees them */
	if (ring_touched_here(queue_id))
		return true;

	/* the common case, every claim: the record exists (a shared look) */
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	if (q != NULL)
	{
		maybe = q->table_maybe;
		*gen = q->table_gen;
	}
	LWLockRelease(ring->lock);
	if (q != NULL)
		return maybe;

	/*
	 * The record is made here if missing, before the probe: a producer that
	 * commits after the probe then finds it and moves its generation on, so
	 * pgjq_ring_table_empty does not clear the flag over its jobs.
	 */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue_id, true);
	if (q != NULL)
	{
		maybe = q->table_maybe;
		*gen = q->table_gen;
	}
	LWLockRelease(ring->lock);
	return maybe;
}

/* pgjq.job had no ready row of the queue when the flag was at gen. */
void
pgjq_ring_table_empty(int32 queue_id, uint64 gen)
{
	RingQueue  *q;

	if (ring == NULL)
		return;
	if (gen == 0)
		return;					/* no record: the flag stays set */
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	q = ring_queue_get(queue_id, false);
	if (q != NULL && q->table_gen == gen)
		q->table_maybe = false;
	LWLockRelease(ring->lock);
}

/* ---------------------------------------------------------------------
 * outcomes
 * --------------------------------------------------------------------- */

/*
 * Lock held: wait until no other open transaction claims, closes or extends
 * the in-flight entry of id whose token is token (0: any), and return it
 * (NULL: none; the lock is held again).
 */
static RingFlight *
flight_settled(int64 id, int64 token, TransactionId xid)
{
	for (;;)
	{
		RingFlight *f = ring_flight_find(id);
		TransactionId other;

		if (f == NULL || f->xid == xid || f->state == RF_OPEN ||
			(token != 0 && f->token != token))
			return f;
		other = f->xid;
		LWLockRelease(ring->lock);
		XactLockTableWait(other, NULL, NULL, XLTW_None);
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	}
}

/*
 * Close the ring claims (id, token) as this transaction's, waiting for a
 * transaction that closes one of them now.  token 0 matches any open claim
 * (cancel).  found[i]: the id is a ring job in flight (else the table
 * engine's); ok[i]: it is closed by this call (else stale).  The closed
 * entries' facts go to *fl (copies).  With lease_before (rescue), only a
 * claim whose lease ends before it is closed (a heartbeat that committed
 * meanwhile makes the pair stale for rescue).
 */
static int
close_claims(int n, const int64 *ids, const int64 *toks, bool *found, bool *ok,
			 RingFlight *fl, TimestampTz lease_before)
{
	TransactionId xid = GetTopTransactionId();
	int			nok = 0;

	ring_reserve_local(0, 0, n);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		RingFlight *f = flight_settled(ids[i], toks[i], xid);

		/*
		 * A job this transaction already closed (completed, failed or taken
		 * out) is no job in flight for it any more: stale (a retried job is a
		 * scheduled row of pgjq.job, a finished one is history).
		 */
		if (f != NULL && f->state == RF_CLOSING && f->xid == xid)
			f = NULL;
		found[i] = f != NULL;
		ok[i] = false;
		if (f == NULL || (toks[i] != 0 && f->token != toks[i]))
			continue;

		/*
		 * OPEN, or claimed or heartbeated by this very transaction (claim and
		 * outcome together)
		 */
		if (!(f->state == RF_OPEN ||
			  ((f->state == RF_CLAIMING || f->state == RF_EXTENDING) && f->xid == xid)))
			continue;
		if (lease_before != 0 && f->lease_until >= lease_before)
			continue;
		ring_note_closed(ids[i], f->state == RF_CLAIMING, f->state == RF_EXTENDING);
		f->state = RF_CLOSING;
		f->xid = xid;
		fl[i] = *f;
		ok[i] = true;
		nok++;
	}
	LWLockRelease(ring->lock);
	return nok;
}

/* Is any of the ids a job in flight? (a shared look: the fast "stale") */
static bool
any_in_flight(int n, const int64 *ids)
{
	bool		any = false;

	if (hash_get_num_entries(ring_flights) == 0)
	{
		/* the count is read without the lock: look again with it */
		LWLockAcquire(ring->lock, LW_SHARED);
		any = hash_get_num_entries(ring_flights) > 0;
		LWLockRelease(ring->lock);
		if (!any)
			return false;
	}
	LWLockAcquire(ring->lock, LW_SHARED);
	for (int i = 0; i < n && !any; i++)
		any = ring_flight_find(ids[i]) != NULL;
	LWLockRelease(ring->lock);
	return any;
}

/* results ($8) is NULL when the call gave none for the queue's jobs: no byte */
static bool tables_known(void);
static bool body_by_id(int64 id, BodyRow *out, int *slot, ItemPointerData *tid, bool latest);

/*
 * Without the preload (a server restarted without it) the ring's state is
 * not there to act on: an outcome for a job whose body is in the ring's
 * tables raises 55000 with the hint, rather than answering "stale" or
 * "not found" for a job that job(id) still shows ready or running.
 */
static void
require_for_ring_jobs(int n, const int64 *ids)
{
	BodyRow		b;
	int			slot;
	ItemPointerData tid;

	if (ring != NULL || !tables_known())
		return;
	for (int i = 0; i < n; i++)
		if (body_by_id(ids[i], &b, &slot, &tid, true))
			pgjq_ring_require();
}

/*
 * Could id be a job in flight?  (The outcomes on one job ask first: no
 * means stale, without taking the lock exclusively.)
 */
static bool
maybe_in_flight(int64 id)
{
	require_for_ring_jobs(1, &id);
	return ring != NULL && ensure_ready(false) && any_in_flight(1, &id);
}

/*
 * One row of the history for a ring job that ends other than by completing
 * (dead, or cancelled: without its payload, as pgjq.job's jobs end), and the
 * jobs-finished hook.  The caller closed its claim.
 */
static PgjqPlan plan_history_one = {
	"INSERT INTO pgjq.job_history (id, queue_id, state, priority, fair_key, dedup_key,"
	"                              attempt, max_attempts, token, enqueued_at, finished_at,"
	"                              worker, last_error, payload, timeout)"
	" VALUES ($1, $2, $3, $4, coalesce($5, ''), $14, $6, $7, $8, $9, $10, $11, $12, $13, $15)",
	15, {INT8OID, INT4OID, CHAROID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INTERVALOID}
};

/* the dedup anchors of jobs that ended: their keys are free again */
static PgjqPlan plan_anchors_end = {
	"DELETE FROM pgjq.job WHERE id = ANY ($1) AND state = 'n'",
	1, {INT8ARRAYOID}, NULL, true
};

static void
anchors_end(int n, const int64 *ids)
{
	Datum		v[1];

	if (n == 0)
		return;
	v[0] = PointerGetDatum(int8_array(ids, n));
	pgjq_spi_run(&plan_anchors_end, v, NULL, 0);
}

static void
history_one(const BodyRow *b, char state, int32 attempt, int64 token, const char *worker,
			Datum last_error, TimestampTz now)
{
	Datum		values[15];
	char		nulls[16] = "               ";

	values[0] = Int64GetDatum(b->id);
	values[1] = Int32GetDatum(b->queue_id);
	values[2] = CharGetDatum(state);
	values[3] = Int16GetDatum(b->priority);
	values[4] = b->fair_key;
	nulls[4] = b->fair_key ? ' ' : 'n';
	values[5] = Int32GetDatum(attempt);
	values[6] = Int32GetDatum(b->max_attempts);
	values[7] = Int64GetDatum(token);
	values[8] = TimestampTzGetDatum(b->enqueued_at);
	values[9] = TimestampTzGetDatum(now);
	values[10] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
	nulls[10] = worker ? ' ' : 'n';
	values[11] = last_error;
	nulls[11] = last_error ? ' ' : 'n';
	/* a dead job keeps its payload for retry_dead */
	values[12] = b->payload;
	nulls[12] = state == PGJQ_FINISHED_DEAD ? ' ' : 'n';
	values[13] = b->dedup_key;
	nulls[13] = b->dedup_key ? ' ' : 'n';
	values[14] = b->timeout_us > 0 ? pgjq_interval_datum(b->timeout_us) : (Datum) 0;
	nulls[14] = b->timeout_us > 0 ? ' ' : 'n';
	pgjq_history_ensure(now);
	pgjq_spi_run(&plan_history_one, values, nulls, 0);
	pgjq_wait_note_finished(b->id, state);
	if (b->dedup_key)
		anchors_end(1, &b->id);
	if (pgjq_jobs_finished_hook)
		pgjq_jobs_finished_hook(b->queue_id, state, 1);
}

/* The body of a closed in-flight job, and its claim's worker. */
static void
closed_body(const RingFlight *f, BodyRow *b, char **worker)
{
	Relation	rel = table_open(body_oid[f->slot], AccessShareLock);

	body_fetch(rel, f->key.id, (ItemPointer) &f->tid, b);
	table_close(rel, NoLock);
	*worker = claim_worker(f->claim_slot, (ItemPointer) &f->claim_tid, f->token);
}

/* limits.c counted the claim's job running; the lane lives while it closes */
static void
left_running(const RingFlight *f)
{
	if (pgjq_left_running_hook)
		pgjq_left_running_hook(f->queue_id, NULL, ring_limits_hash(f->lane->key.keyhash), 1);
}

int64
pgjq_ring_complete(int n, Datum *ids, Datum *tokens, const Datum *results,
				   const bool *result_nulls, TimestampTz now)
{
	bool	   *found = palloc(sizeof(bool) * n);
	int64	   *idv = palloc(sizeof(int64) * n);
	int64	   *tokv = palloc(sizeof(int64) * n);
	bool	   *ok = palloc(sizeof(bool) * n);
	RingFlight *fl = palloc(sizeof(RingFlight) * n);
	int64	   *cid,
			   *ctok;
	int			nok;
	int			m = 0;

	if (ring == NULL)
	{
		for (int i = 0; i < n; i++)
			idv[i] = DatumGetInt64(ids[i]);
		require_for_ring_jobs(n, idv);
	}
	if (ring == NULL || !ensure_ready(false))
		return 0;
	for (int i = 0; i < n; i++)
	{
		idv[i] = DatumGetInt64(ids[i]);
		tokv[i] = DatumGetInt64(tokens[i]);
		/* token 0 means "any" to close_claims: never a real token */
		if (tokv[i] == 0)
			tokv[i] = -1;
	}
	if (!any_in_flight(n, idv))
		return 0;
	nok = close_claims(n, idv, tokv, found, ok, fl, 0);
	if (nok == 0)
		return 0;
	cid = palloc(sizeof(int64) * nok);
	ctok = palloc(sizeof(int64) * nok);
	for (int i = 0; i < n; i++)
		if (ok[i])
		{
			cid[m] = idv[i];
			ctok[m] = tokv[i];
			m++;
		}
	log_closes('d', now, nok, cid, ctok);

	/* the anchors of completed jobs with a dedup_key (cancelled: below) */
	m = 0;
	for (int i = 0; i < n; i++)
		if (ok[i] && fl[i].anchored && !fl[i].cancel_requested)
			cid[m++] = idv[i];
	anchors_end(m, cid);

	/*
	 * a job whose cancellation was requested ends as cancelled, and does not
	 * count as completed (as in pgjq.job)
	 */
	for (int i = 0; i < n; i++)
		if (ok[i] && fl[i].cancel_requested)
		{
			BodyRow		b;
			char	   *worker;

			closed_body(&fl[i], &b, &worker);
			history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt, fl[i].token, worker,
						b.last_error, now);
			left_running(&fl[i]);
			ok[i] = false;
			nok--;
		}

	/* the history: one job_done row per queue */
	pgjq_history_ensure(now);
	for (int i = 0; i < n; i++)
	{
		Datum	   *di,
				   *da,
				   *de,
				   *dr;
		bool	   *drn;
		bool		any_result = false;
		int			c = 0;
		int32		qid;
		int64		lo = PG_INT64_MAX,
					hi = PG_INT64_MIN;
		Datum		values[PGJQ_DONE_NATTS];
		bool		nulls[PGJQ_DONE_NATTS] = {false};
		uint64	   *kh;

		if (!ok[i])
			continue;
		qid = fl[i].queue_id;
		di = palloc(sizeof(Datum) * n);
		da = palloc(sizeof(Datum) * n);
		de = palloc(sizeof(Datum) * n);
		dr = palloc(sizeof(Datum) * n);
		drn = palloc(sizeof(bool) * n);
		kh = palloc(sizeof(uint64) * n);
		for (int j = i; j < n; j++)
			if (ok[j] && fl[j].queue_id == qid)
			{
				/* the lane lives while its running count holds this job */
				kh[c] = ring_limits_hash(fl[j].lane->key.keyhash);
				di[c] = Int64GetDatum(idv[j]);
				da[c] = Int32GetDatum(fl[j].attempt);
				de[c] = TimestampTzGetDatum(fl[j].enqueued_at);
				drn[c] = results == NULL || result_nulls[j];
				dr[c] = drn[c] ? (Datum) 0 : results[j];
				any_result |= !drn[c];
				lo = Min(lo, idv[j]);
				hi = Max(hi, idv[j]);
				ok[j] = false;
				c++;
			}
		values[0] = Int32GetDatum(qid);
		values[1] = TimestampTzGetDatum(now);
		values[2] = Int64GetDatum(lo);
		values[3] = Int64GetDatum(hi);
		values[4] = PointerGetDatum(construct_array(di, c, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[5] = PointerGetDatum(construct_array(da, c, INT4OID, 4, true, TYPALIGN_INT));
		values[6] = PointerGetDatum(construct_array(de, c, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		if (any_result)
		{
			int			dims[1] = {c};
			int			lbs[1] = {1};

			values[7] = PointerGetDatum(construct_md_array(dr, drn, 1, dims, lbs, JSONBOID, -1,
														   false, TYPALIGN_INT));
		}
		else
			nulls[7] = true;
		pgjq_history_insert_done(values, nulls);
		for (int k = 0; k < c; k++)
			pgjq_wait_note_finished(DatumGetInt64(di[k]), PGJQ_FINISHED_COMPLETED);
		if (pgjq_jobs_finished_hook)
			pgjq_jobs_finished_hook(qid, PGJQ_FINISHED_COMPLETED, c);

		/* limits.c counted them at their claim: per key, for key limits */
		if (pgjq_left_running_hook)
		{
			qsort(kh, c, sizeof(uint64), u64_cmp);
			for (int a = 0, b; a < c; a = b)
			{
				for (b = a + 1; b < c && kh[b] == kh[a]; b++)
					;
				pgjq_left_running_hook(qid, NULL, kh[a], b - a);
			}
		}
	}
	/* last: the slot's lock is not held while this waits for anyone */
	client_truncate();
	return nok;
}

static PgjqPlan plan_queue_backoff = {
	"SELECT backoff_base, backoff_max FROM pgjq.queue WHERE queue_id = $1",
	1, {INT4OID}
};

/*
 * a retry or a snooze: the job's next attempt waits in pgjq.job; a job with
 * a dedup_key turns its anchor into that row (the key stays held)
 */
static PgjqPlan plan_fail_schedule_anchor = {
	"UPDATE pgjq.job SET state = 's', attempt = $5, max_attempts = $6, token = $7, run_at = $9,"
	"                    lease_until = NULL, worker = $10, last_error = $11, payload = $12,"
	"                    timeout = $13"
	" WHERE id = $1 AND state = 'n'",
	13, {INT8OID, INT4OID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, INTERVALOID}
};
static PgjqPlan plan_fail_schedule = {
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	"                      max_attempts, token, enqueued_at, run_at, lease_until, worker,"
	"                      last_error, cancel_requested, payload, timeout)"
	" VALUES ($1, $2, 's', $3, coalesce($4, ''), NULL, $5, $6, $7, $8, $9, NULL, $10, $11,"
	"         false, $12, $13)",
	13, {INT8OID, INT4OID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, INTERVALOID}
};

/*
 * fail, snooze and rescue of a ring job in flight, without moving it first:
 * the claim is closed (one 'f' log row) and the job written once where it
 * goes, a scheduled row of pgjq.job (retry or snooze: promotion appends it
 * to the ring again when it is due) or the history (dead, or cancelled when
 * its cancellation was requested).  snooze_until != 0: a snooze (the
 * attempt is given back, the error kept); else a failure with error,
 * decided by pgjq_outcome_decide (retry_in_us < 0: the queue's backoff).
 * lease_before != 0 (rescue): only if the lease still ends before it.
 * Returns PGJQ_RING_NOT_MINE, PGJQ_RING_STALE, or PGJQ_RING_FAILED with
 * *outcome ('s' scheduled, PGJQ_FINISHED_DEAD or PGJQ_FINISHED_CANCELLED)
 * and for 's' *run_at.
 */
int
pgjq_ring_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
			   TimestampTz snooze_until, TimestampTz lease_before, TimestampTz now,
			   char *outcome, TimestampTz *run_at)
{
	bool		found,
				ok;
	RingFlight	f;
	int64		tok = token == 0 ? -1 : token;
	BodyRow		b;
	char	   *worker;
	int32		attempt;
	Datum		last_error;
	char		r;

	if (!maybe_in_flight(id))
		return PGJQ_RING_NOT_MINE;
	(void) close_claims(1, &id, &tok, &found, &ok, &f, lease_before);
	if (!found)
		return PGJQ_RING_NOT_MINE;
	if (!ok)
		return PGJQ_RING_STALE;

	closed_body(&f, &b, &worker);
	if (snooze_until != 0)
	{
		r = f.cancel_requested ? PGJQ_FINISHED_CANCELLED : 's';
		*run_at = snooze_until;
		attempt = b.attempt - 1;
		last_error = b.last_error;
	}
	else
	{
		PgjqRunningJob job;
		Datum		qv[1] = {Int32GetDatum(b.queue_id)};
		bool		isnull;

		pgjq_spi_run(&plan_queue_backoff, qv, NULL, 1);
		job.id = id;
		job.token = f.token;
		job.attempt = b.attempt;
		job.max_attempts = b.max_attempts;
		job.cancel_requested = f.cancel_requested;
		job.backoff_base_us = SPI_processed == 0 ? 0 :
			pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(0, 1, &isnull)));
		job.backoff_max_us = SPI_processed == 0 ? 0 :
			pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(0, 2, &isnull)));
		r = pgjq_outcome_decide(&job, retry_in_us, now, run_at);
		attempt = b.attempt;
		last_error = error ? CStringGetTextDatum(error) : b.last_error;
	}
	/* a cancelled snooze keeps the attempt it ran, as pgjq.job's */
	if (r == PGJQ_FINISHED_CANCELLED)
		attempt = b.attempt;
	log_append(f.token, now, 'f', &id, 1);
	if (r == 's')
	{
		Datum		values[13];
		char		nulls[14] = "             ";

		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum(b.queue_id);
		values[2] = Int16GetDatum(b.priority);
		values[3] = b.fair_key;
		nulls[3] = b.fair_key ? ' ' : 'n';
		values[4] = Int32GetDatum(attempt);
		values[5] = Int32GetDatum(b.max_attempts);
		values[6] = Int64GetDatum(f.token);
		values[7] = TimestampTzGetDatum(b.enqueued_at);
		values[8] = TimestampTzGetDatum(*run_at);
		values[9] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
		nulls[9] = worker ? ' ' : 'n';
		values[10] = last_error;
		nulls[10] = last_error ? ' ' : 'n';
		values[11] = b.payload;
		values[12] = b.timeout_us > 0 ? pgjq_interval_datum(b.timeout_us) : (Datum) 0;
		nulls[12] = b.timeout_us > 0 ? ' ' : 'n';
		pgjq_spi_run(f.anchored ? &plan_fail_schedule_anchor : &plan_fail_schedule,
					 values, nulls, 0);
		if (SPI_processed != 1)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("pgjq ring: the dedup anchor of job " INT64_FORMAT " is missing", id)));
	}
	else
		history_one(&b, r, attempt, f.token, worker, last_error, now);
	left_running(&f);
	*outcome = r;
	return PGJQ_RING_FAILED;
}

static PgjqPlan plan_queue_lease = {
	"SELECT $2 + q.lease FROM pgjq.queue q WHERE q.queue_id = $1",
	2, {INT4OID, TIMESTAMPTZOID}, NULL, true
};

/*
 * End (id, token), a ring job in flight whose cancellation was requested,
 * as cancelled (heartbeat's way of answering it).  False if it was not
 * closed here (stale meanwhile).
 */
static bool
finish_cancelled(int64 id, int64 token, TimestampTz now)
{
	bool		found,
				ok;
	RingFlight	f;
	BodyRow		b;
	char	   *worker;

	(void) close_claims(1, &id, &token, &found, &ok, &f, 0);
	if (!ok)
		return false;
	closed_body(&f, &b, &worker);
	log_append(f.token, now, 'x', &id, 1);
	history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt, f.token, worker, b.last_error, now);
	left_running(&f);
	return true;
}

/*
 * Heartbeat of a ring job in flight: the entry becomes EXTENDING (rescue and
 * the other outcomes of its claim wait for this transaction) and takes the
 * new lease when this commits; one 'h' log row (token, new lease, id) makes
 * it durable.  Nothing moves, nothing is updated.  A job whose cancellation
 * was requested ends as cancelled instead (PGJQ_RING_CANCELLED).
 */
int
pgjq_ring_heartbeat(int64 id, int64 token, int64 extend_us, TimestampTz now,
					TimestampTz *lease_until)
{
	TransactionId xid;
	RingFlight *f;
	int32		queue_id = 0;
	int			r = PGJQ_RING_NOT_MINE;

	if (!maybe_in_flight(id))
		return PGJQ_RING_NOT_MINE;

	/* the queue's lease, read before the lock (it is no lock-held work) */
	if (extend_us < 0)
	{
		LWLockAcquire(ring->lock, LW_SHARED);
		f = ring_flight_find(id);
		if (f != NULL)
			queue_id = f->queue_id;
		LWLockRelease(ring->lock);
		if (f == NULL)
			return PGJQ_RING_NOT_MINE;
	}
	if (extend_us >= 0)
		*lease_until = now + extend_us;
	else
	{
		Datum		values[2] = {Int32GetDatum(queue_id), TimestampTzGetDatum(now)};
		bool		isnull;

		pgjq_spi_run(&plan_queue_lease, values, NULL, 1);
		if (SPI_processed == 0)
			return PGJQ_RING_NOT_MINE;	/* its queue was dropped: cannot be */
		*lease_until = DatumGetTimestampTz(pgjq_spi_get(0, 1, &isnull));
	}

	xid = GetTopTransactionId();
	ring_reserve_extended();
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	f = flight_settled(id, token, xid);
	if (f == NULL || (f->state == RF_CLOSING && f->xid == xid))
		r = PGJQ_RING_NOT_MINE; /* as close_claims: stale */
	else if (f->token != token)
		r = PGJQ_RING_STALE;
	else if (f->cancel_requested)
		r = PGJQ_RING_CANCELLED;
	else if (f->deadline != 0 && now >= f->deadline)
		r = PGJQ_RING_TIMED_OUT;
	else
	{
		bool		was_open = f->state == RF_OPEN;

		if (f->deadline != 0)
			*lease_until = Min(*lease_until, f->deadline);

		Assert(was_open || f->xid == xid);
		ring_note_extended(id, token, *lease_until, was_open, false);
		if (was_open)
		{
			f->state = RF_EXTENDING;
			f->xid = xid;
		}
		r = PGJQ_RING_EXTENDED;
	}
	LWLockRelease(ring->lock);
	if (r == PGJQ_RING_EXTENDED)
		log_append(token, *lease_until, 'h', &id, 1);
	else if (r == PGJQ_RING_CANCELLED && !finish_cancelled(id, token, now))
		r = PGJQ_RING_STALE;
	return r;
}

/*
 * cancel() of a ring job in flight: its cancellation is requested (one 'q'
 * log row; the entry takes it when this commits, EXTENDING until then), and
 * its holder's next outcome or heartbeat ends it as cancelled.  False if id
 * is no ring job in flight.
 */
bool
pgjq_ring_request_cancel(int64 id)
{
	TransactionId xid;
	RingFlight *f;
	int64		token = 0;
	bool		mine = false;

	if (!maybe_in_flight(id))
		return false;
	xid = GetTopTransactionId();
	ring_reserve_extended();
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	f = flight_settled(id, 0, xid);
	/* one this transaction closed is no ring job for it (close_claims) */
	if (f != NULL && !(f->state == RF_CLOSING && f->xid == xid))
	{
		bool		was_open = f->state == RF_OPEN;

		mine = true;
		token = f->token;
		if (!f->cancel_requested)
		{
			ring_note_extended(id, token, f->lease_until, was_open, true);
			if (was_open)
			{
				f->state = RF_EXTENDING;
				f->xid = xid;
			}
		}
		else
			token = 0;			/* requested before: nothing to write */
	}
	LWLockRelease(ring->lock);
	if (token != 0)
		log_append(token, GetCurrentTimestamp(), 'q', &id, 1);
	return mine;
}

/*
 * The snapshot of the reads that answer from the ring's tables (job(),
 * queue_stats and metrics() on a standby, and in a REPEATABLE READ or
 * SERIALIZABLE transaction): that transaction's own, so that ring jobs are
 * seen as of the same moment as the rows of pgjq.job and the history in
 * the same query (shared memory holds only the present); else the latest.
 * The rebuild and the writers always read the latest.
 */
static Snapshot
read_snapshot(bool latest)
{
	return !latest && IsolationUsesXactSnapshot() ? GetTransactionSnapshot() : GetLatestSnapshot();
}

/* The newest body of a job (by the id index of each slot), or false. */
static bool
body_by_id(int64 id, BodyRow *out, int *slot, ItemPointerData *tid, bool latest)
{
	bool		found = false;
	Snapshot	snap = RegisterSnapshot(read_snapshot(latest));

	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(body_oid[s], AccessShareLock);
		List	   *idxoids = RelationGetIndexList(rel);
		Relation	idx;
		IndexScanDesc scan;
		ScanKeyData key;
		TupleTableSlot *ts;

		if (idxoids == NIL)
		{
			table_close(rel, AccessShareLock);
			continue;
		}
		idx = index_open(linitial_oid(idxoids), AccessShareLock);
		ts = table_slot_create(rel, NULL);
		ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(id));
		scan = index_beginscan(rel, idx, snap, 1, 0);
		index_rescan(scan, &key, 1, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, ts))
		{
			bool		shouldfree;
			HeapTuple	tup = ExecFetchSlotHeapTuple(ts, false, &shouldfree);
			BodyRow		b;

			body_read(tup, RelationGetDescr(rel), &b);
			b.xmin = HeapTupleHeaderGetXmin(tup->t_data);
			if (!found || b.after > out->after)
			{
				*out = b;
				*slot = s;
				*tid = tup->t_self;
				found = true;
			}
			if (shouldfree)
				heap_freetuple(tup);
		}
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(ts);
		index_close(idx, AccessShareLock);
		table_close(rel, AccessShareLock);
	}
	UnregisterSnapshot(snap);
	return found;
}

/*
 * Lock held: the new in-flight entry f takes p out of lane l (already
 * removed from it, or this transaction's own pending job) as a claim of
 * this transaction would, and this transaction closes it at once: cancel's
 * way of moving a ready ring job to pgjq.job.
 */
static void
take_closing(RingFlight *f, RingLane *l, const RingPos *p, int64 tok, int32 attempt,
			 bool pending)
{
	l->running++;
	l->queue->running++;
	f->token = tok;
	f->lease_until = 0;
	f->pending = pending;
	f->enqueued_at = p->enqueued_at;
	f->xid = GetTopTransactionId();
	f->tid = p->tid;
	f->slot = p->slot;
	f->attempt = attempt;
	f->queue_id = l->key.queue_id;
	f->lane = l;
	ring_lane_settle(l);
	if (!pending)
		ring->held++;
	ring_claim_begun(f);
	ring_note_claimed(f->key.id);
	/* and closed by the same transaction */
	ring_note_closed(f->key.id, true, false);
	f->state = RF_CLOSING;
}

/*
 * The ready ring job taken by take_closing ends as cancelled: one 'x' log
 * row closes the claim it was taken with, one history row says so (as a
 * cancelled job of pgjq.job, without its payload).
 */
static void
cancel_ready(const RingFlight *f)
{
	TimestampTz now = GetCurrentTimestamp();
	BodyRow		b;
	char	   *worker;			/* none: the job was never claimed */

	closed_body(f, &b, &worker);
	log_append(f->token, now, 'x', &f->key.id, 1);
	/* the attempts made: the body counts the one about to run */
	history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt - 1, f->token, worker, b.last_error, now);
}

/*
 * take_ready for a job this transaction enqueued and has not published (its
 * body is not visible to this command yet): taken from the pending list as
 * its own claim would, then closed as cancelled.  False if it is not one.
 */
static bool
take_own_ready(int64 id, RingFlight *copy)
{
	RingPos		p;
	RingLane   *l;
	RingFlight *f;
	int64		tok = 0;
	bool		taken = false;

	tok = next_token(&tok);
	ring_reserve_local(0, 1, 1);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	if (ring_take_own_id(id, &p, &l))
	{
		f = ring_flight_enter(id);
		if (f == NULL)
		{
			ring_take_own_undo(&p, 1);
			LWLockRelease(ring->lock);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("pgjq's ring engine has no room for more jobs in flight"),
					 errhint("Raise pgjq.ring_max_in_flight and restart the server.")));
		}
		take_closing(f, l, &p, tok, 1, true);
		*copy = *f;
		taken = true;
	}
	LWLockRelease(ring->lock);
	return taken;
}

/*
 * The ready ring job id out of its lane, as a claim of this transaction that
 * it closes at once (take_closing); *copy is its in-flight entry.  False if
 * it is not a ready ring job (running, finished, or not in the ring).
 */
static bool
take_ready(int64 id, RingFlight *copy)
{
	BodyRow		b;
	int			slot;
	ItemPointerData tid;
	RingLaneKey key;
	RingLane   *l;
	RingFlight *f;
	RingPos		p;
	bool		taken = false;
	int64		tok = 0;

	require_for_ring_jobs(1, &id);
	if (ring == NULL || !ensure_ready(false))
		return false;
	if (ring_writing() && take_own_ready(id, copy))
		return true;			/* this transaction's own enqueue */
	if (!body_by_id(id, &b, &slot, &tid, true))
		return false;
	body_lane_key(&b, &key);
	tok = next_token(&tok);
	ring_reserve_local(0, 1, 1);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	l = hash_search(ring_lanes, &key, HASH_FIND, NULL);
	if (l != NULL && ring_lane_remove(l, id, &p))
	{
		f = ring_flight_enter(id);
		if (f == NULL)
		{
			/* the node went back to the pool: there is room */
			ring_lane_push_front(l, &p);
			LWLockRelease(ring->lock);
			ereport(ERROR,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("pgjq's ring engine has no room for more jobs in flight"),
					 errhint("Raise pgjq.ring_max_in_flight and restart the server.")));
		}
		take_closing(f, l, &p, tok, b.attempt, false);
		*copy = *f;
		taken = true;
	}
	LWLockRelease(ring->lock);
	return taken;
}

bool
pgjq_ring_take_ready(int64 id)
{
	RingFlight	copy;

	if (!take_ready(id, &copy))
		return false;
	cancel_ready(&copy);
	return true;
}

/* a replaced ready ring job's next version (debounce) in pgjq.job */
static PgjqPlan plan_replace_anchor = {
	"UPDATE pgjq.job SET state = $2, attempt = $3, token = $4, run_at = $5, payload = $6,"
	"                    last_error = $7, timeout = $8"
	" WHERE id = $1 AND state = 'n'",
	8, {INT8OID, CHAROID, INT4OID, INT8OID, TIMESTAMPTZOID, JSONBOID, TEXTOID, INTERVALOID}, NULL, true
};
static PgjqPlan plan_replace_insert = {
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	"                      max_attempts, token, enqueued_at, run_at, last_error,"
	"                      cancel_requested, payload, timeout)"
	" SELECT $1, $9, $2, $10, coalesce($11, ''), NULL, $3, $12, $4, $13, $5, $7, false, $6, $8",
	13, {INT8OID, CHAROID, INT4OID, INT8OID, TIMESTAMPTZOID, JSONBOID, TEXTOID, INTERVALOID,
	INT4OID, INT2OID, TEXTOID, INT4OID, TIMESTAMPTZOID}
};

/*
 * on_duplicate => 'replace' of a ready ring job: out of its lane as cancel
 * takes it (its claim closed by one 'f' log row, as a snooze closes one),
 * and its next version, with the new payload, waits in pgjq.job until
 * run_at: its anchor turned into that row, or (a key held for a period,
 * without an anchor) a new row.  run_at is due, no later than debounce_max
 * after the job's enqueue (0: no bound).  False, and nothing changed, if the
 * job is not a ready ring job.
 */
bool
pgjq_ring_replace_ready(int64 id, Datum payload, TimestampTz due, int64 debounce_max_us,
						TimestampTz now, char *state, TimestampTz *run_at)
{
	RingFlight	f;
	BodyRow		b;
	char	   *worker;
	Datum		values[13];
	char		nulls[14] = "             ";

	if (!take_ready(id, &f))
		return false;
	closed_body(&f, &b, &worker);
	*run_at = due;
	if (debounce_max_us > 0 && b.enqueued_at + debounce_max_us < due)
		*run_at = b.enqueued_at + debounce_max_us;
	*state = *run_at > now ? 's' : 'r';
	log_append(f.token, now, 'f', &id, 1);
	values[0] = Int64GetDatum(id);
	values[1] = CharGetDatum(*state);
	/* pgjq.job counts the attempts made; a body, the one it is for */
	values[2] = Int32GetDatum(b.attempt - 1);
	values[3] = Int64GetDatum(f.token);
	values[4] = TimestampTzGetDatum(*run_at);
	values[5] = payload;
	values[6] = b.last_error;
	nulls[6] = b.last_error ? ' ' : 'n';
	values[7] = b.timeout_us > 0 ? pgjq_interval_datum(b.timeout_us) : (Datum) 0;
	nulls[7] = b.timeout_us > 0 ? ' ' : 'n';
	values[8] = Int32GetDatum(b.queue_id);
	values[9] = Int16GetDatum(b.priority);
	values[10] = b.fair_key;
	nulls[10] = b.fair_key ? ' ' : 'n';
	values[11] = Int32GetDatum(b.max_attempts);
	values[12] = TimestampTzGetDatum(b.enqueued_at);
	pgjq_spi_run(b.dedup_key ? &plan_replace_anchor : &plan_replace_insert, values, nulls, 0);
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the dedup anchor of job " INT64_FORMAT " is missing", id)));
	return true;
}

/* ---------------------------------------------------------------------
 * space: relocation of stragglers
 * --------------------------------------------------------------------- */

/*
 * The oldest slot in use if it is worth relocating now, else -1 (lock
 * held).  Worth it: every slot is in use (the producers' next slot is
 * this one), it is sealed and nobody writes to it, and at most a quarter of
 * the jobs it received are unfinished: the stragglers of a slow tenant or
 * long leases, not a backlog about to be claimed (a backlog is live data;
 * copying it would only write it twice).
 */
static int
straggler_slot(RingDb *db)
{
	int			c = (db->cur_slot + 1) % RING_NSLOTS;
	RingSlot   *st = &db->slots[c];

	if (!db->ready || st->clean || !st->sealed || st->writers > 0 || st->truncating ||
		st->open == 0 || st->open * 4 > st->appended)
		return -1;
	return c;
}

typedef struct Straggler
{
	int64		id;
	int32		node;			/* lane node, -1 in flight */
	ItemPointerData tid;
	int64		token;			/* in flight: its claim */
	TimestampTz lease_until;
	TimestampTz deadline;		/* in flight: its claim's (0: none) */
	ItemPointerData claim_tid;	/* in flight: its claim row (then the copy's) */
	uint16		claim_slot;
	bool		cancel;			/* in flight: its cancellation was requested */
} Straggler;

/*
 * Copy up to `limit` unfinished jobs of the oldest slot forward into the
 * current one, so that the oldest slot can be truncated; returns how many.
 *
 * A copy is the same version of the body (same after_token), and the
 * transaction writes one 'r' log row naming the copies (so a rebuild knows
 * which rows are copies when it finds the ring order) and, for jobs in
 * flight, their claim rows again ('c', same token and lease) in the current
 * slot, since the claim rows in the oldest slot go with it.  Nothing else
 * changes: a job keeps its lane position, token and lease.  Shared memory
 * moves to the copies when the transaction commits (apply_relocation in
 * ring_shmem.c); until then, and if it rolls back, the old rows serve.  A
 * rebuild that finds both copies takes the newer one.  A
 * SHARE UPDATE EXCLUSIVE lock on the old slot's bodies keeps a second
 * relocation and the truncation away meanwhile; claims and outcomes go on.
 */
static int64
relocate(int limit)
{
	RingDb	   *db;
	int			c,
				s;
	int			n = 0,
				nflight = 0;
	Straggler  *st = palloc(sizeof(Straggler) * limit);
	BodyRow    *rows;
	ItemPointerData *tids;
	int64	   *ids;
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	RingFlight *f;
	Relation	rel;
	TimestampTz now = GetCurrentTimestamp();

	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	c = db == NULL ? -1 : straggler_slot(db);
	LWLockRelease(ring->lock);
	if (c < 0 || !ConditionalLockRelationOid(body_oid[c], ShareUpdateExclusiveLock))
		return 0;

	/* under the lock again: not truncated meanwhile, and who is there */
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	if (db == NULL || straggler_slot(db) != c)
	{
		LWLockRelease(ring->lock);
		return 0;
	}
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
	{
		if (l->key.dbid != MyDatabaseId)
			continue;
		for (int32 k = l->head; k >= 0 && n < limit; k = ring->nodes[k].next)
			if (ring->nodes[k].p.slot == c)
			{
				st[n].id = ring->nodes[k].p.id;
				st[n].node = k;
				st[n].tid = ring->nodes[k].p.tid;
				n++;
			}
		if (n == limit)
		{
			hash_seq_term(&hs);
			break;
		}
	}
	if (n < limit)
	{
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
		{
			/* claimed or closing: that transaction decides; next time */
			if (f->key.dbid != MyDatabaseId || f->slot != c || f->state != RF_OPEN)
				continue;
			st[n].id = f->key.id;
			st[n].node = -1;
			st[n].tid = f->tid;
			st[n].token = f->token;
			st[n].lease_until = f->lease_until;
			st[n].deadline = f->deadline;
			st[n].claim_tid = f->claim_tid;
			st[n].claim_slot = f->claim_slot;
			st[n].cancel = f->cancel_requested;
			n++;
			nflight++;
			if (n == limit)
			{
				hash_seq_term(&hs);
				break;
			}
		}
	}
	LWLockRelease(ring->lock);
	if (n == 0)
		return 0;

	rows = palloc(sizeof(BodyRow) * n);
	tids = palloc(sizeof(ItemPointerData) * n);
	ids = palloc(sizeof(int64) * n);
	rel = table_open(body_oid[c], AccessShareLock);
	for (int i = 0; i < n; i++)
	{
		body_fetch(rel, st[i].id, &st[i].tid, &rows[i]);
		ids[i] = st[i].id;
	}
	table_close(rel, NoLock);

	/* the current slot cannot move on meanwhile: its next one is c */
	s = slot_for_write(n);
	Assert(s != c);
	body_append(s, n, rows, tids);
	log_append_to(s, 0, now, 'r', ids, n, NULL, 0, NULL);
	for (int i = n - nflight; i < n; i++)
	{
		int			m = 0;
		ItemPointerData ctid;

		if (st[i].node == -2)
			continue;			/* already in a row */
		for (int j = i; j < n; j++)
			if (st[j].node == -1 && st[j].token == st[i].token &&
				st[j].lease_until == st[i].lease_until && st[j].deadline == st[i].deadline)
			{
				ids[m++] = st[j].id;
				st[j].node = -2;
			}
		/* one claim call, one worker: its first job's claim row names it */
		log_append_to(s, st[i].token, st[i].lease_until, 'c', ids, m,
					  claim_worker(st[i].claim_slot, &st[i].claim_tid, st[i].token),
					  st[i].deadline, &ctid);
		for (int j = i; j < n; j++)
			if (st[j].token == st[i].token && st[j].lease_until == st[i].lease_until &&
				st[j].deadline == st[i].deadline)
				st[j].claim_tid = ctid;
	}
	/* and the cancellation requests, whose 'q' rows go with the old slot too */
	for (int i = n - nflight; i < n; i++)
		if (st[i].cancel)
			log_append_to(s, st[i].token, now, 'q', &st[i].id, 1, NULL, 0, NULL);

	ring_reserve_relocated(n);
	for (int i = 0; i < n; i++)
	{
		RingPos		to;

		to.id = st[i].id;
		to.enqueued_at = rows[i].enqueued_at;
		to.tid = tids[i];
		to.slot = (uint16) s;
		ring_note_relocated(st[i].id, st[i].node >= 0 ? st[i].node : -1, c, &to,
							st[i].token, st[i].node >= 0 ? NULL : &st[i].claim_tid);
	}
	/* rare: once per truncation held up by stragglers */
	elog(LOG, "pgjq: copying %d unfinished jobs (%d of them running) of ring slot %d into slot %d",
		 n, nflight, c, s);
	pgjq_crash_point("ring_relocate");
	return n;
}

/*
 * One step of giving space back (the background worker's, or
 * pgjq._ring_reclaim()): truncate the oldest slot if it is closed, else
 * relocate up to `limit` of its stragglers.  Returns the jobs relocated
 * plus the slots truncated.
 */
int64
pgjq_ring_reclaim(int limit)
{
	static TimestampTz forgot_at = 0;
	TimestampTz now;

	if (ring == NULL || !ensure_ready(false))
		return 0;

	/*
	 * The worker's pass, at most once a second: records of databases dropped
	 * meanwhile go (their drop's commit gave them back already, unless it ran
	 * where pgjq was not loaded)
	 */
	now = GetCurrentTimestamp();
	if (now - forgot_at >= USECS_PER_SEC)
	{
		forgot_at = now;
		forget_gone_databases();
	}
	if (maybe_truncate())
		return 1;
	return relocate(Max(limit, 1));
}

int
pgjq_ring_expired(TimestampTz now, int limit, int64 *ids, int64 *tokens)
{
	HASH_SEQ_STATUS hs;
	RingFlight *f;
	int			n = 0;

	if (ring == NULL || !ensure_ready(false))
		return 0;
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
	{
		if (f->key.dbid != MyDatabaseId || f->state != RF_OPEN || f->lease_until >= now)
			continue;
		ids[n] = f->key.id;
		tokens[n] = f->token;
		if (++n >= limit)
		{
			hash_seq_term(&hs);
			break;
		}
	}
	LWLockRelease(ring->lock);
	return n;
}

bool
pgjq_ring_job_key(int64 id, int64 token, int32 *queue_id, char **fair_key)
{
	RingFlight *f;
	ItemPointerData tid;
	int			slot = -1;
	Relation	rel;
	BodyRow		b;

	if (ring == NULL || !maybe_in_flight(id))
		return false;
	LWLockAcquire(ring->lock, LW_SHARED);
	f = ring_flight_find(id);
	if (f != NULL && f->token == token)
	{
		*queue_id = f->queue_id;
		tid = f->tid;
		slot = f->slot;
	}
	LWLockRelease(ring->lock);
	if (slot < 0)
		return false;
	rel = table_open(body_oid[slot], AccessShareLock);
	body_fetch(rel, id, &tid, &b);
	table_close(rel, NoLock);
	*fair_key = b.fair_key ? TextDatumGetCString(b.fair_key) : "";
	return true;
}

TimestampTz
pgjq_ring_deadline(int64 id, int64 token)
{
	RingFlight *f;
	TimestampTz d = 0;

	if (ring == NULL || !maybe_in_flight(id))
		return 0;
	LWLockAcquire(ring->lock, LW_SHARED);
	f = ring_flight_find(id);
	if (f != NULL && f->token == token)
		d = f->deadline;
	LWLockRelease(ring->lock);
	return d;
}

TimestampTz
pgjq_ring_next_deadline(void)
{
	HASH_SEQ_STATUS hs;
	RingFlight *f;
	TimestampTz next = DT_NOEND;

	if (ring == NULL || !ensure_ready(false))
		return next;
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
		if (f->key.dbid == MyDatabaseId && f->state != RF_CLOSING &&
			f->state != RF_EXTENDING && f->lease_until < next &&
			f->lease_until != 0)
			next = f->lease_until;
	LWLockRelease(ring->lock);
	return next;
}

int64
pgjq_ring_drop_jobs(int32 queue_id, bool drop, bool force, int64 *nready)
{
	bool		running_too = drop && force;
	TransactionId xid;
	int64		running = 0;
	int64	   *rid = NULL;
	int64	   *rtok = NULL;
	int			nrun = 0;
	bool		waited;

	*nready = 0;
	if (ring == NULL || !ensure_ready(false))
		return 0;
	xid = GetTopTransactionId();
	/* the queue's record goes when the drop commits */
	if (drop)
		ring_note_queue_dropped(queue_id);

	/* wait for open transactions that claim or close jobs of the queue */
	do
	{
		HASH_SEQ_STATUS hs;
		RingFlight *f;
		TransactionId other = InvalidTransactionId;

		waited = false;
		running = 0;
		LWLockAcquire(ring->lock, LW_SHARED);
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
		{
			if (f->key.dbid != MyDatabaseId || f->queue_id != queue_id)
				continue;
			if (f->state != RF_OPEN && f->xid != xid)
			{
				other = f->xid;
				hash_seq_term(&hs);
				break;
			}
			if (f->state == RF_OPEN || f->state == RF_EXTENDING)
				running++;
		}
		LWLockRelease(ring->lock);
		if (TransactionIdIsValid(other))
		{
			XactLockTableWait(other, NULL, NULL, XLTW_None);
			waited = true;
		}
	} while (waited);

	if (drop && running > 0 && !force)
		return running;

	/*
	 * The ready jobs: out of their lanes until this transaction ends, one 'x'
	 * log row per thousand (a closing row implies its claim, so the rebuild
	 * finds them finished).
	 */
	for (;;)
	{
		int64		tok = 0;
		int64		ids[1000];
		RingLane   *held[1000];
		int			nheld = -1,
					h = 0;
		int			k = 0;
		RingQueue  *q;
		bool		any;

		LWLockAcquire(ring->lock, LW_SHARED);
		q = ring_queue_get(queue_id, false);
		any = q != NULL && q->ready > 0;
		LWLockRelease(ring->lock);
		if (!any)
			break;
		ring_reserve_dropped(1000);
		tok = next_token(&tok);
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
		q = ring_queue_get(queue_id, false);
		/* lanes parked at a key limit go too */
		if (q != NULL)
			ring_queue_unpark_all(q);
		while (q != NULL && k < 1000)
		{
			RingLane   *l = ring_next_lane(q);
			RingPos		p;

			/*
			 * and the lanes of held keys, out of the round robin: found in
			 * one walk of the lane table per chunk (they stay pinned, so
			 * unlinked, until this transaction ends)
			 */
			if (l == NULL)
			{
				if (nheld < 0)
					nheld = ring_holds_held_lanes(q, held, 1000 - k);
				while (h < nheld && held[h]->count == 0)
					h++;
				l = h < nheld ? held[h] : NULL;
			}
			if (l == NULL)
				break;
			ring_lane_pop_front(l, &p);
			ring_note_dropped(&p, l);
			ring_lane_settle(l);
			ids[k++] = p.id;
		}
		LWLockRelease(ring->lock);
		if (k > 0)
		{
			log_append(tok, GetCurrentTimestamp(), 'x', ids, k);
			/* their dedup anchors, if any (drop_queue deletes them anyway) */
			if (!drop)
				anchors_end(k, ids);
		}
		*nready += k;
	}

	if (running_too && running > 0)
	{
		HASH_SEQ_STATUS hs;
		RingFlight *f;
		bool	   *found,
				   *ok;
		RingFlight *fl;

		rid = palloc(sizeof(int64) * running);
		rtok = palloc(sizeof(int64) * running);
		LWLockAcquire(ring->lock, LW_SHARED);
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
			if (f->key.dbid == MyDatabaseId && f->queue_id == queue_id &&
				(f->state == RF_OPEN || f->state == RF_EXTENDING) && nrun < running)
			{
				rid[nrun] = f->key.id;
				rtok[nrun] = f->token;
				nrun++;
			}
		LWLockRelease(ring->lock);
		found = palloc(sizeof(bool) * Max(nrun, 1));
		ok = palloc(sizeof(bool) * Max(nrun, 1));
		fl = palloc(sizeof(RingFlight) * Max(nrun, 1));
		(void) close_claims(nrun, rid, rtok, found, ok, fl, 0);
		{
			int			m = 0;

			for (int i = 0; i < nrun; i++)
				if (ok[i])
				{
					rid[m] = rid[i];
					rtok[m] = rtok[i];
					m++;
				}
			if (m > 0)
				log_closes('x', GetCurrentTimestamp(), m, rid, rtok);
		}
	}
	/* its jobs ended or vanished: wait_jobs() callers look again */
	if (*nready > 0 || nrun > 0)
		pgjq_wait_note_finished(0, 0);
	return running;
}

/* lock held: the enqueue time of the queue's oldest ready job, 0 if none */
static TimestampTz
oldest_ready(RingQueue *q)
{
	TimestampTz oldest = 0;

	/* the head of each lane is its oldest job; linked lanes have one */
	for (RingPrio *r = q->prios; r != NULL; r = r->next)
	{
		RingLane   *h = r->head;
		RingLane   *l = h;

		while (l != NULL)
		{
			TimestampTz t = ring->nodes[l->head].p.enqueued_at;

			if (oldest == 0 || t < oldest)
				oldest = t;
			l = l->next;
			if (l == h)
				break;
		}
	}
	return oldest;
}

/*
 * Lock held: the queue's ready and running ring jobs as committed, as this
 * transaction sees them (as a query of pgjq.job would): another
 * transaction's claim not committed yet leaves its jobs ready (or unseen,
 * if that transaction enqueued them), this transaction's own claims count
 * as running.
 */
static void
committed_counts(RingQueue *q, int64 *ready, int64 *running)
{
	int64		mine = 0,
				mine_own = 0;

	if (q->claiming > 0)
		ring_own_claiming(q->key.queue_id, &mine, &mine_own);
	*ready = q->ready + (q->claiming - mine) - (q->claiming_own - mine_own);
	*running = q->running - q->claiming + mine;
}

void
pgjq_ring_counts(int32 queue_id, bool committed, int64 *ready, int64 *running,
				 TimestampTz *oldest)
{
	RingQueue  *q;

	*ready = *running = 0;
	*oldest = 0;
	if (ring == NULL || !ensure_ready(false) || (committed && IsolationUsesXactSnapshot()))
	{
		/*
		 * a hot standby (or no preload) keeps no ring state: the tables say
		 * it (read_snapshot)
		 */
		(void) standby_counts(queue_id, ready, running, oldest);
		return;
	}
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	if (q != NULL && committed)
	{
		committed_counts(q, ready, running);
		*oldest = oldest_ready(q);
	}
	else if (q != NULL)
	{
		*ready = q->ready;
		*running = q->running;
		*oldest = oldest_ready(q);
	}
	LWLockRelease(ring->lock);
}

/* ---------------------------------------------------------------------
 * rebuild: shared memory from the durable rows
 * --------------------------------------------------------------------- */
typedef struct RbClaim
{
	int64		id;				/* key */
	int64		token;			/* the newest claim */
	TimestampTz lease_until;	/* of that claim's 'c' row; 0 if none */
	TimestampTz deadline;		/* of that claim's 'c' row; 0 if none */
	uint8		cslots;			/* bit s: slot s has that 'c' row */
	ItemPointerData ctids[RING_NSLOTS]; /* where, by slot */
	bool		cancel;			/* its cancellation was requested */
} RbClaim;

typedef struct RbPair
{
	int64		id;
	int64		token;
} RbPair;

typedef struct RbBody
{
	int64		id;				/* key */
	int64		after;
	int32		queue_id;
	int32		attempt;
	TimestampTz enqueued_at;
	ItemPointerData tid;
	uint16		slot;
	uint8		copies;			/* bit s: slot s holds this version too */
	bool		anchored;		/* its anchor in pgjq.job stays while it runs */
	bool		waiting_key;	/* its anchor stays only until a claim */
	ItemPointerData tids[RING_NSLOTS];	/* where, by slot */
	RingLaneKey key;
} RbBody;

/* a relocated copy: job id's body in slot s is a copy (an 'r' log row) */
typedef struct RbCopy
{
	int64		id;
	int32		slot;
	int32		pad;
} RbCopy;

static HTAB *
rb_hash(const char *name, Size keysize, Size entrysize)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = keysize;
	ctl.entrysize = entrysize;
	ctl.hcxt = CurrentMemoryContext;
	return hash_create(name, 65536, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static int
rb_cmp(const void *a, const void *b)
{
	int64		x = (*(RbBody *const *) a)->id;
	int64		y = (*(RbBody *const *) b)->id;

	return (x > y) - (x < y);
}

/* What the durable rows say: claims, closes and the newest body of each job. */
typedef struct RbScan
{
	HTAB	   *claims;			/* id -> RbClaim */
	HTAB	   *closed;			/* (id, token) closed */
	HTAB	   *bodies;			/* id -> RbBody */
	HTAB	   *copies;			/* RbCopy */
	int64		rows[RING_NSLOTS];
	int64		minid[RING_NSLOTS]; /* of bodies that are not copies */
	bool		used[RING_NSLOTS];	/* not empty on disk */
	bool		visible[RING_NSLOTS];	/* a committed row of any kind */
	uint64		gen[RING_NSLOTS];	/* its 'g' rows' generation; 0: none */
	bool		marked;			/* some slot has a 'g' row */
	int			cur;			/* the slot producers write to */
} RbScan;

/*
 * 0.2.0's rule, for slots written before the 'g' rows existed (the first
 * rebuild after the update): with all four in use, the oldest is the one
 * whose bodies are oldest, not counting relocated copies (a slot with log
 * rows or copies only is the newest: producers moved to it and rolled
 * back, or nothing but copies was written there yet).  Wrong when a
 * promoted body (which keeps its job's old id) is in the newest slot: the
 * review of 0.2.0, C1, which the 'g' rows close.
 */
static int
legacy_current_slot(const RbScan *sc)
{
	int			nused = 0;
	int			oldest = -1;

	for (int s = 0; s < RING_NSLOTS; s++)
		nused += sc->used[s];
	if (nused == 0)
		return 0;
	if (nused < RING_NSLOTS)
	{
		for (int s = 0; s < RING_NSLOTS; s++)
			if (sc->used[s] && !sc->used[(s + 1) % RING_NSLOTS])
				return s;
	}
	for (int s = 0; s < RING_NSLOTS; s++)
		if (sc->minid[s] != PG_INT64_MAX && (oldest < 0 || sc->minid[s] < sc->minid[oldest]))
			oldest = s;
	return oldest < 0 ? 0 : (oldest + RING_NSLOTS - 1) % RING_NSLOTS;
}

/*
 * The current slot: slots in use form an arc in ring order, oldest first;
 * the current one ends it.  It is the slot of the newest generation: every
 * committed row of a slot comes with a committed 'g' row of the generation
 * the slot got when producers moved to it (slot_for_write).  A slot with
 * no committed row is empty whatever its size on disk (a batch that rolled
 * back), and one with rows but no 'g' row was written by 0.2.0, which had
 * none: older than every slot that has one.
 */
static int
current_slot(const RbScan *sc)
{
	int			cur = -1;

	if (sc->marked)
	{
		for (int s = 0; s < RING_NSLOTS; s++)
			if (sc->gen[s] != 0 && (cur < 0 || sc->gen[s] > sc->gen[cur]))
				cur = s;
		return cur;
	}
	return legacy_current_slot(sc);
}

/* Which slots are in use (sealed or current); the others are clean. */
static bool
slot_in_use(const RbScan *sc, int s)
{
	return sc->marked ? sc->visible[s] || s == sc->cur : sc->used[s];
}

/* Scan the live slots (in the current memory context); read_snapshot(latest). */
static void
scan_tables(RbScan *sc, bool latest)
{
	Snapshot	snap = RegisterSnapshot(read_snapshot(latest));
	RbBody	   *b;
	HASH_SEQ_STATUS hs;

	sc->claims = rb_hash("pgjq rb claims", sizeof(int64), sizeof(RbClaim));
	sc->closed = rb_hash("pgjq rb closed", sizeof(RbPair), sizeof(RbPair));
	sc->bodies = rb_hash("pgjq rb bodies", sizeof(int64), sizeof(RbBody));
	sc->copies = rb_hash("pgjq rb copies", sizeof(RbCopy), sizeof(RbCopy));
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		sc->rows[s] = 0;
		sc->minid[s] = PG_INT64_MAX;
		sc->used[s] = false;
		sc->visible[s] = false;
		sc->gen[s] = 0;
	}
	sc->marked = false;

	/* the logs: claims ('c'), and closes, which imply their claim */
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(log_oid[s], AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		if (RelationGetNumberOfBlocks(rel) > 0)
			sc->used[s] = true;
		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			int64		token = DatumGetInt64(heap_getattr(tup, L_TOKEN, desc, &isnull));
			TimestampTz at = DatumGetTimestampTz(heap_getattr(tup, L_AT, desc, &isnull));
			char		kind = DatumGetChar(heap_getattr(tup, L_KIND, desc, &isnull));
			ArrayType  *arr = DatumGetArrayTypeP(heap_getattr(tup, L_IDS, desc, &isnull));
			int			n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
			int64	   *ids = (int64 *) ARR_DATA_PTR(arr);

			sc->visible[s] = true;
			if (kind == 'g')
			{
				/* the slot's generation (current_slot) */
				sc->gen[s] = Max(sc->gen[s], (uint64) token);
				sc->marked = true;
				continue;
			}
			if (kind == 'r')
			{
				/* relocated copies, in this slot's bodies */
				for (int i = 0; i < n; i++)
				{
					RbCopy		k = {ids[i], s, 0};

					hash_search(sc->copies, &k, HASH_ENTER, NULL);
				}
				continue;
			}
			for (int i = 0; i < n; i++)
			{
				bool		found;
				RbClaim    *c = hash_search(sc->claims, &ids[i], HASH_ENTER, &found);

				if (!found || c->token < token)
				{
					c->token = token;
					c->lease_until = 0;
					c->deadline = 0;
					c->cslots = 0;
					c->cancel = false;
				}
				/* a cancellation request ('q') of the claim of its token */
				if (kind == 'q' && c->token == token)
					c->cancel = true;

				/*
				 * A heartbeat ('h') extends the claim of its token; rows are
				 * not read in the order they were written, so the lease is
				 * the latest any of them granted (a heartbeat that shortened
				 * it is undone by a crash: later than before, never earlier)
				 */
				if ((kind == 'c' || kind == 'h') && c->token == token)
					c->lease_until = Max(c->lease_until, at);
				if (kind == 'c' && c->token == token)
				{
					bool		dnull = true;
					Datum		d = (Datum) 0;

					if (desc->natts >= L_DEADLINE)
						d = heap_getattr(tup, L_DEADLINE, desc, &dnull);
					c->cslots |= 1 << s;
					c->ctids[s] = tup->t_self;
					if (!dnull)
						c->deadline = DatumGetTimestampTz(d);
				}
				if (kind != 'c' && kind != 'h' && kind != 'q')
				{
					RbPair		k = {ids[i], token};

					hash_search(sc->closed, &k, HASH_ENTER, NULL);
				}
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}

	/* the bodies: the newest version of every job */
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(body_oid[s], AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		if (RelationGetNumberOfBlocks(rel) > 0)
			sc->used[s] = true;
		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull,
						found;
			int64		id = DatumGetInt64(heap_getattr(tup, B_ID, desc, &isnull));
			Datum		d = heap_getattr(tup, B_AFTER, desc, &isnull);
			int64		after = isnull ? 0 : DatumGetInt64(d);

			RbCopy		ck = {id, s, 0};

			sc->visible[s] = true;
			sc->rows[s]++;
			if (hash_search(sc->copies, &ck, HASH_FIND, NULL) == NULL)
				sc->minid[s] = Min(sc->minid[s], id);
			b = hash_search(sc->bodies, &id, HASH_ENTER, &found);
			if (!found || b->after < after)
			{
				BodyRow		r;

				body_read(tup, desc, &r);
				b->after = after;
				b->queue_id = r.queue_id;
				b->attempt = r.attempt;
				b->enqueued_at = r.enqueued_at;
				b->tid = tup->t_self;
				b->slot = s;
				b->copies = 0;
				b->anchored = BODY_ANCHORED_RUNNING(&r);
				b->waiting_key = r.dedup_key != (Datum) 0 && r.dedup_scope == 'w';
				body_lane_key(&r, &b->key);
			}
			if (b->after == after)
			{
				b->copies |= 1 << s;
				b->tids[s] = tup->t_self;
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}
	UnregisterSnapshot(snap);

	/*
	 * A relocated job has the same version in two slots until the older one
	 * is truncated: the newer copy (in ring order) is the one that counts, as
	 * in shared memory once the relocation committed.
	 */
	sc->cur = current_slot(sc);
	hash_seq_init(&hs, sc->bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
	{
		if ((b->copies & (b->copies - 1)) == 0)
			continue;			/* one slot */
		for (int age = 0; age < RING_NSLOTS; age++)
		{
			int			t = (sc->cur + RING_NSLOTS - age) % RING_NSLOTS;

			if (b->copies & (1 << t))
			{
				b->slot = t;
				b->tid = b->tids[t];
				break;
			}
		}
	}
}

/* A job's durable state: 'r' ready, 'a' in flight (*claim), 'f' finished. */
static char
durable_state(RbScan *sc, RbBody *b, RbClaim **claim)
{
	RbClaim    *c = hash_search(sc->claims, &b->id, HASH_FIND, NULL);
	RbPair		k;

	*claim = c;
	if (c == NULL || c->token <= b->after)
		return 'r';
	k.id = b->id;
	k.token = c->token;
	return hash_search(sc->closed, &k, HASH_FIND, NULL) != NULL ? 'f' : 'a';
}

static void
rebuild(void)
{
	TimestampTz start = GetCurrentTimestamp();
	RingHoldRow *holds;
	int			nholds;
	MemoryContext ctx = AllocSetContextCreate(CurrentMemoryContext, "pgjq ring rebuild",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(ctx);
	RbScan		sc;
	int64		open[RING_NSLOTS] = {0};
	int64	   *rows = sc.rows;
	RbBody	  **list;
	int64		nlist = 0,
				nready = 0,
				nflight = 0;
	HASH_SEQ_STATUS hs;
	RbBody	   *b;
	int			cur;
	RingDb	   *db;
	const char *full = NULL;
	HTAB	   *bodies;
	int64		holds_lost;

	scan_tables(&sc, true);
	bodies = sc.bodies;
	cur = sc.cur;

	/* every job: ready, in flight or finished; in enqueue order */
	list = palloc(sizeof(RbBody *) * Max(hash_get_num_entries(bodies), 1));
	hash_seq_init(&hs, bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
		list[nlist++] = b;
	qsort(list, nlist, sizeof(RbBody *), rb_cmp);

	/* the held keys, before the lanes are settled (key_hold.c) */
	nholds = ring_holds_read(&holds);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	ring_clear_db(db);
	holds_lost = ring_holds_install(db, holds, nholds);
	for (int64 i = 0; i < nlist && full == NULL; i++)
	{
		RbClaim    *c;
		RingQueue  *q;
		RingLane   *l = NULL;

		b = list[i];
		if (durable_state(&sc, b, &c) == 'f')
			continue;			/* finished */
		if ((q = ring_queue_get(b->queue_id, true)) == NULL)
			full = "pgjq.ring_max_queues";
		else if ((l = ring_lane_get(&b->key, q)) == NULL)
			full = "pgjq.ring_max_lanes";
		if (full != NULL)
			break;
		if (c != NULL && c->token > b->after)
		{
			RingFlight *f = ring_flight_enter(b->id);

			if (f == NULL)
			{
				full = "pgjq.ring_max_in_flight";
				break;
			}
			f->token = c->token;
			f->pending = false;
			f->cancel_requested = c->cancel;
			/* a claim whose 'c' row is gone (cannot happen): expired now */
			f->lease_until = c->lease_until;
			f->deadline = c->deadline;
			f->enqueued_at = b->enqueued_at;
			f->xid = InvalidTransactionId;
			f->tid = b->tid;
			f->slot = b->slot;
			/* a relocated claim has a row in two slots: the newer is kept */
			for (int age = 0; age < RING_NSLOTS; age++)
			{
				int			t = (cur + RING_NSLOTS - age) % RING_NSLOTS;

				if (c->cslots & (1 << t))
				{
					f->claim_slot = t;
					f->claim_tid = c->ctids[t];
					break;
				}
			}
			f->state = RF_OPEN;
			f->attempt = b->attempt;
			f->anchored = b->anchored;
			f->queue_id = b->queue_id;
			f->lane = l;
			l->running++;
			q->running++;
			nflight++;
		}
		else
		{
			RingPos		p;

			if (ring->count + ring->reserved + ring->held >= pgjq_ring_positions)
			{
				full = "pgjq.ring_positions";
				break;
			}
			p.id = b->id;
			p.enqueued_at = b->enqueued_at;
			p.tid = b->tid;
			p.slot = b->slot;
			ring_lane_push_back(l, &p);
			nready++;
		}
		open[b->slot]++;
		ring_lane_settle(l);
	}
	if (full != NULL)
	{
		ring_clear_db(db);
		LWLockRelease(ring->lock);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("pgjq's ring engine cannot hold this database's jobs: %s is too small", full),
				 errhint("Raise the setting and restart the server; no job is lost.")));
	}
	db->gen = 0;
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		RingSlot   *st = &db->slots[s];

		memset(st, 0, sizeof(RingSlot));
		st->open = open[s];
		st->appended = rows[s];
		st->gen = sc.gen[s];
		st->marked = sc.gen[s] != 0;
		db->gen = Max(db->gen, sc.gen[s]);
		if (s == cur)
			continue;
		if (slot_in_use(&sc, s))
			st->sealed = true;
		else
			st->clean = true;
	}
	/* the current slot without a 'g' row (new, or 0.2.0's): the next gen */
	if (db->slots[cur].gen == 0)
		db->slots[cur].gen = ++db->gen;
	db->cur_slot = cur;
	db->stalled = false;
	db->incarnation = body_oid[0];
	db->rebuilds++;
	db->ready = true;
	LWLockRelease(ring->lock);
	/* counted under the lock, reported without it */
	if (holds_lost > 0)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg_plural("%lld held key of this database does not fit in pgjq.ring_max_holds and is not held",
							   "%lld held keys of this database do not fit in pgjq.ring_max_holds and are not held",
							   holds_lost, (long long) holds_lost),
				 errhint("Raise pgjq.ring_max_holds and restart the server, or release keys.")));

	MemoryContextSwitchTo(old);
	MemoryContextDelete(ctx);
	elog(LOG, "pgjq: ring of database %u rebuilt: " INT64_FORMAT " ready, " INT64_FORMAT
		 " in flight, from " INT64_FORMAT " body rows in %.1f ms",
		 MyDatabaseId, nready, nflight, rows[0] + rows[1] + rows[2] + rows[3],
		 (double) (GetCurrentTimestamp() - start) / 1000.0);
}

/* ---------------------------------------------------------------------
 * SQL: pgjq._ring_job(id) for job(), pgjq._ring_counts() for queue_stats
 * --------------------------------------------------------------------- */
PG_FUNCTION_INFO_V1(pgjq_ring_job);

/*
 * The ring's view of a job: ready (in a lane) or running (in flight), as a
 * pgjq.job_info row; nothing when the ring does not hold it unfinished (a
 * finished ring job is in pgjq.job_done, a moved one in pgjq.job).
 */
Datum
pgjq_ring_job(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	BodyRow		b;
	int			slot;
	ItemPointerData tid;
	RingLaneKey key;
	bool		ready = false,
				running = false;
	TimestampTz lease = 0;
	Datum		values[18];		/* pgjq.job_info; result (16) and waiting_for
								 * (17) stay NULL */
	bool		nulls[18];
	char	   *qname = NULL;
	char	   *worker = NULL;
	bool		cancel = false;
	bool		live;

	InitMaterializedSRF(fcinfo, 0);
	live = ring != NULL && ensure_ready(false);
	pgjq_storage_begin();
	if (!live || IsolationUsesXactSnapshot())
	{
		/*
		 * a hot standby (or a server without the preload): the tables say it;
		 * and to a REPEATABLE READ or SERIALIZABLE transaction, as of its
		 * snapshot (read_snapshot)
		 */
		char		st;

		if (standby_job(id, &st, &lease, &worker, &cancel, &b))
		{
			ready = st == 'r';
			running = st == 'a';
		}
	}
	else if (body_by_id(id, &b, &slot, &tid, true))
	{
		RingFlight *f;
		int64		ctoken = 0;
		int			cslot = RING_NO_SLOT;
		ItemPointerData ctid;
		bool		waited = false;

		body_lane_key(&b, &key);
again:
		LWLockAcquire(ring->lock, LW_SHARED);
		f = ring_flight_find(id);
		/* a claim shows as running once committed, and to its own transaction */
		if (f != NULL && (f->state != RF_CLAIMING || f->xid == GetTopTransactionIdIfAny()))
		{
			running = true;
			lease = f->lease_until;
			/* as committed, and to the transaction that requested it */
			cancel = f->cancel_requested ||
				(f->state == RF_EXTENDING && f->xid == GetTopTransactionIdIfAny() &&
				 ring_cancel_requested_here(id));
			ctoken = f->token;
			cslot = f->claim_slot;
			ctid = f->claim_tid;
		}
		else
		{
			RingLane   *l = hash_search(ring_lanes, &key, HASH_FIND, NULL);

			/* a job being claimed counts as ready until its claim commits */
			if (f != NULL)
				ready = true;
			for (int32 n = l ? l->head : -1; n >= 0 && !ready; n = ring->nodes[n].next)
				if (ring->nodes[n].p.id == id)
					ready = true;
		}
		LWLockRelease(ring->lock);

		/*
		 * Neither: finished, or its mover (enqueue, promotion) has committed
		 * and its commit callback has not published it yet.  That callback
		 * runs before the mover's xid lock goes: wait for it, look again.
		 */
		if (!ready && !running && !waited && TransactionIdIsNormal(b.xmin) &&
			!TransactionIdIsCurrentTransactionId(b.xmin))
		{
			XactLockTableWait(b.xmin, NULL, NULL, XLTW_None);
			waited = true;
			goto again;
		}
		/* the claim row names the worker (it is read without the ring's lock) */
		if (running)
			worker = claim_worker(cslot, &ctid, ctoken);
	}
	if (ready || running)
	{
		Datum		qv[1] = {Int32GetDatum(b.queue_id)};
		static PgjqPlan plan_qname = {
			"SELECT name FROM pgjq.queue WHERE queue_id = $1", 1, {INT4OID}
		};
		bool		isnull;

		pgjq_spi_run(&plan_qname, qv, NULL, 1);
		if (SPI_processed == 1)
			qname = MemoryContextStrdup(pgjq_result_cxt,
										TextDatumGetCString(pgjq_spi_get(0, 1, &isnull)));
	}
	if (ready || running)
	{
		MemoryContext old = MemoryContextSwitchTo(pgjq_result_cxt);

		memset(nulls, true, sizeof(nulls));
		values[0] = Int64GetDatum(id);
		nulls[0] = false;
		if (qname)
		{
			values[1] = CStringGetTextDatum(qname);
			nulls[1] = false;
		}
		values[2] = CStringGetTextDatum(running ? "running" : "ready");
		nulls[2] = false;

		/*
		 * attempts made so far, as pgjq.job counts them: a ready job has not
		 * run this one
		 */
		values[3] = Int32GetDatum(running ? b.attempt : b.attempt - 1);
		nulls[3] = false;
		values[4] = Int32GetDatum(b.max_attempts);
		nulls[4] = false;
		values[5] = Int16GetDatum(b.priority);
		nulls[5] = false;
		if (b.fair_key)
		{
			values[6] = datumCopy(b.fair_key, false, -1);
			nulls[6] = false;
		}
		if (b.dedup_key)
		{
			values[7] = datumCopy(b.dedup_key, false, -1);
			nulls[7] = false;
		}
		values[8] = datumCopy(b.payload, false, -1);
		nulls[8] = false;
		if (b.last_error)
		{
			values[14] = datumCopy(b.last_error, false, -1);
			nulls[14] = false;
		}
		values[9] = TimestampTzGetDatum(b.enqueued_at);
		nulls[9] = false;
		values[10] = TimestampTzGetDatum(b.run_at ? b.run_at : b.enqueued_at);
		nulls[10] = false;
		if (running)
		{
			values[11] = TimestampTzGetDatum(lease);
			nulls[11] = false;
		}
		if (running && worker)
		{
			values[13] = CStringGetTextDatum(worker);
			nulls[13] = false;
		}
		values[15] = BoolGetDatum(running && cancel);
		nulls[15] = false;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		MemoryContextSwitchTo(old);
	}
	pgjq_storage_end();
	return (Datum) 0;
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

PG_FUNCTION_INFO_V1(pgjq_ring_counts_sql);
PG_FUNCTION_INFO_V1(pgjq_ring_reclaim_sql);

/* pgjq._ring_reclaim(max_jobs) */
Datum
pgjq_ring_reclaim_sql(PG_FUNCTION_ARGS)
{
	int32		max_jobs = PG_GETARG_INT32(0);

	if (max_jobs < 1 || max_jobs > PGJQ_RING_RECLAIM_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_jobs must be between 1 and %d", PGJQ_RING_RECLAIM_MAX)));
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("pgjq maintenance cannot run during recovery"),
				 errhint("The background worker of the primary runs it.")));
	pgjq_ring_require();
	PG_RETURN_INT64(pgjq_maintenance_ring_reclaim(max_jobs));
}

/* pgjq._ring_counts(): (queue_id, ready, running, oldest_ready) of this database's ring queues */
Datum
pgjq_ring_counts_sql(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS hs;
	RingQueue  *q;
	int			n = 0,
				max;
	Datum	   *rowsv;
	int64		ready,
				running;

	InitMaterializedSRF(fcinfo, 0);
	if (ring == NULL || !ensure_ready(false) || IsolationUsesXactSnapshot())
	{
		/*
		 * a hot standby (or no preload): counted from the tables; as of the
		 * snapshot of a REPEATABLE READ or SERIALIZABLE transaction too
		 */
		StandbyCount *e;

		if (!standby_scan())
			return (Datum) 0;
		hash_seq_init(&hs, sb_counts);
		while ((e = hash_seq_search(&hs)) != NULL)
		{
			Datum		v[4];
			bool		nulls[4] = {false, false, false, e->oldest == 0};

			v[0] = Int32GetDatum(e->queue_id);
			v[1] = Int64GetDatum(e->ready);
			v[2] = Int64GetDatum(e->running);
			v[3] = TimestampTzGetDatum(e->oldest);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, v, nulls);
		}
		return (Datum) 0;
	}
	/* room for every queue the table can hold: no allocation under the lock */
	max = pgjq_ring_max_queues;
	rowsv = palloc(sizeof(Datum) * 4 * max);
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_queues);
	while ((q = hash_seq_search(&hs)) != NULL)
	{
		if (q->key.dbid != MyDatabaseId || (q->ready == 0 && q->running == 0) || n >= max)
			continue;
		committed_counts(q, &ready, &running);
		rowsv[4 * n] = Int32GetDatum(q->key.queue_id);
		rowsv[4 * n + 1] = Int64GetDatum(ready);
		rowsv[4 * n + 2] = Int64GetDatum(running);
		rowsv[4 * n + 3] = TimestampTzGetDatum(oldest_ready(q));
		n++;
	}
	LWLockRelease(ring->lock);
	for (int i = 0; i < n; i++)
	{
		bool		nulls[4] = {false, false, false, DatumGetTimestampTz(rowsv[4 * i + 3]) == 0};

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &rowsv[4 * i], nulls);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * verify(): shared memory against the durable rows
 * --------------------------------------------------------------------- */
typedef struct VerifyMem
{
	int64		id;				/* key */
	char		state;			/* 'r' in a lane (or being claimed), 'a' in
								 * flight */
	int64		token;
	int			slot;			/* the slot of the body it points to */
	ItemPointerData tid;
	bool		cancel;			/* in flight: its cancellation was requested */
} VerifyMem;

static void
verify_add(PgjqVerifyRow **rows, int *n, int *max, const char *object,
		   const char *expected, const char *found)
{
	if (*n == *max)
	{
		*max *= 2;
		*rows = repalloc(*rows, sizeof(PgjqVerifyRow) * *max);
	}
	(*rows)[*n].area = "ring";
	(*rows)[*n].object = pstrdup(object);
	(*rows)[*n].expected = pstrdup(expected);
	(*rows)[*n].found = pstrdup(found);
	(*n)++;
}

static const char *
state_name(char st, int64 token)
{
	switch (st)
	{
		case 'r':
			return "ready";
		case 'a':
			return psprintf("running with token " INT64_FORMAT, token);
		case 'f':
			return "finished";
		default:
			return "absent";
	}
}

/*
 * One comparison of this database's ring state with its tables: every job
 * the tables say is ready must be in a lane (or being claimed), every job in
 * flight must be in the in-flight table with its token, nothing else may be
 * in either, and each slot's count of unfinished jobs must match.  Returns
 * the disagreements (rows allocated in the caller's context).
 */
static PgjqPlan plan_verify_anchors = {
	"SELECT id FROM pgjq.job WHERE state = 'n'", 0, {InvalidOid}
};

/*
 * The ring order in shared memory against the 'g' rows (the invariant
 * "the ring order is durable"): every slot with a committed row has the
 * generation its 'g' rows say (none for a slot 0.2.0 wrote), a slot marked
 * in memory has a committed 'g' row, no slot in use counts as clean, and
 * the rebuild would take the same slot as current (unless the current one
 * holds nothing committed yet: then a rebuild starts it afresh, losing
 * nothing).
 */
static void
verify_ring_order(const RbScan *sc, const RingSlot *mem, int mem_cur,
				  PgjqVerifyRow **rows, int *n, int *max)
{
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		if (sc->gen[s] != 0 && sc->gen[s] != mem[s].gen)
			verify_add(rows, n, max, psprintf("slot %d: generation", s),
					   psprintf(UINT64_FORMAT, sc->gen[s]), psprintf(UINT64_FORMAT, mem[s].gen));
		if (mem[s].marked && sc->gen[s] == 0)
			verify_add(rows, n, max, psprintf("slot %d: generation", s),
					   "no committed 'g' row", psprintf("marked with " UINT64_FORMAT, mem[s].gen));
		if (sc->visible[s] && mem[s].clean)
			verify_add(rows, n, max, psprintf("slot %d", s), "in use (committed rows)", "clean");
		if (sc->visible[s] && sc->marked && sc->gen[s] == 0 && mem[s].gen != 0)
			verify_add(rows, n, max, psprintf("slot %d: generation", s),
					   "none (rows written by 0.2.0)", psprintf(UINT64_FORMAT, mem[s].gen));
	}
	if (sc->marked && sc->cur != mem_cur && sc->visible[mem_cur])
		verify_add(rows, n, max, "ring order: the current slot",
				   psprintf("slot %d (the newest generation)", sc->cur),
				   psprintf("slot %d", mem_cur));
}

/*
 * The shared accounting, all databases (invariants I4 and I5): the ready
 * count is the positions in lanes, each lane's count its list, each lane in
 * its priority's record, each priority record counting its lanes, and
 * `held` the claims not committed yet.  Read under the shared lock, so
 * exact (every change of these is made under the exclusive one); the rows
 * are made after it is released.
 */
static void
verify_accounting(PgjqVerifyRow **rows, int *n, int *max)
{
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	RingPrio   *pr;
	RingFlight *f;
	int64		nodes = 0,
				count,
				claiming = 0,
				closing = 0,
				held;
	int64		bad_count = 0,
				bad_prio = 0,
				bad_nlanes = 0;
	HTAB	   *per_prio;
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(RingPrio *);
	ctl.entrysize = sizeof(RingPrio *) + sizeof(int64);
	ctl.hcxt = CurrentMemoryContext;
	per_prio = hash_create("pgjq verify prios", 256, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	LWLockAcquire(ring->lock, LW_SHARED);
	count = ring->count;
	held = ring->held;
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
	{
		int64		len = 0;
		char	   *e;

		for (int32 k = l->head; k >= 0; k = ring->nodes[k].next)
			len++;
		nodes += len;
		if (len != l->count)
			bad_count++;
		if (l->prio == NULL || l->prio->key.dbid != l->key.dbid ||
			l->prio->key.queue_id != l->key.queue_id || l->prio->key.priority != l->key.priority)
			bad_prio++;
		else
		{
			e = hash_search(per_prio, &l->prio, HASH_ENTER, NULL);
			(*(int64 *) (e + sizeof(RingPrio *)))++;
		}
	}
	hash_seq_init(&hs, ring_prios);
	while ((pr = hash_seq_search(&hs)) != NULL)
	{
		char	   *e = hash_search(per_prio, &pr, HASH_FIND, NULL);
		int64		lanes = e ? *(int64 *) (e + sizeof(RingPrio *)) : 0;

		if (lanes != pr->nlanes || lanes == 0)
			bad_nlanes++;
	}
	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
	{
		if (f->state == RF_CLAIMING && !f->pending)
			claiming++;
		/* a claim its own transaction closes again is still held */
		if (f->state == RF_CLOSING && !f->pending)
			closing++;
	}
	LWLockRelease(ring->lock);

	if (nodes != count)
		verify_add(rows, n, max, "ring positions: ready (all databases)",
				   psprintf(INT64_FORMAT " in lanes", nodes), psprintf(INT64_FORMAT " counted", count));
	if (held < claiming || held > claiming + closing)
		verify_add(rows, n, max, "ring positions: being claimed (all databases)",
				   psprintf(INT64_FORMAT " claims not committed (and up to " INT64_FORMAT
							" closed by their claimers)", claiming, closing),
				   psprintf(INT64_FORMAT " counted", held));
	if (bad_count > 0)
		verify_add(rows, n, max, "ring lanes: ready count", "the lane's positions",
				   psprintf(INT64_FORMAT " lanes differ", bad_count));
	if (bad_prio > 0)
		verify_add(rows, n, max, "ring lanes: priority", "the record of the lane's priority",
				   psprintf(INT64_FORMAT " lanes without it", bad_prio));
	if (bad_nlanes > 0)
		verify_add(rows, n, max, "ring priorities: lanes", "as many as point to it, at least one",
				   psprintf(INT64_FORMAT " records differ", bad_nlanes));
}

static int
verify_once(PgjqVerifyRow **rows)
{
	RbScan		sc;
	HTAB	   *mem;
	HASHCTL		ctl;
	HASH_SEQ_STATUS hs;
	RbBody	   *b;
	VerifyMem  *m;
	RingFlight *f;
	RingLane   *l;
	RingDb	   *db;
	int64		open[RING_NSLOTS] = {0};
	int64		mem_open[RING_NSLOTS] = {0};
	RingSlot	mem_slot[RING_NSLOTS];
	int			mem_cur = 0;
	int64		mem_used = 0;
	int			n = 0,
				max = 16;
	bool		ready;
	HTAB	   *anchors;
	int64	   *aid;

	*rows = palloc(sizeof(PgjqVerifyRow) * max);
	scan_tables(&sc, true);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(VerifyMem);
	ctl.hcxt = CurrentMemoryContext;
	mem = hash_create("pgjq ring verify", 1024, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	/* shared memory, copied under the lock (no allocation but the hash's) */
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	ready = db != NULL && db->ready;
	if (ready)
	{
		for (int s = 0; s < RING_NSLOTS; s++)
		{
			mem_open[s] = db->slots[s].open;
			mem_slot[s] = db->slots[s];
		}
		mem_cur = db->cur_slot;
		mem_used = ring->count + ring->reserved + ring->held;
		hash_seq_init(&hs, ring_lanes);
		while ((l = hash_seq_search(&hs)) != NULL)
		{
			if (l->key.dbid != MyDatabaseId)
				continue;
			for (int32 k = l->head; k >= 0; k = ring->nodes[k].next)
			{
				m = hash_search(mem, &ring->nodes[k].p.id, HASH_ENTER, NULL);
				m->state = 'r';
				m->token = 0;
				m->cancel = false;
				m->slot = ring->nodes[k].p.slot;
				m->tid = ring->nodes[k].p.tid;
			}
		}
		hash_seq_init(&hs, ring_flights);
		while ((f = hash_seq_search(&hs)) != NULL)
		{
			if (f->key.dbid != MyDatabaseId)
				continue;
			m = hash_search(mem, &f->key.id, HASH_ENTER, NULL);
			/* an open transaction's claim is still ready in the tables */
			m->state = f->state == RF_CLAIMING ? 'r' : 'a';
			m->token = f->token;
			m->cancel = f->cancel_requested;
			m->slot = f->slot;
			m->tid = f->tid;
		}
	}
	LWLockRelease(ring->lock);
	if (!ready)
		return 0;				/* rebuilt from the tables at its first call */

	/*
	 * the dedup anchors in pgjq.job, read with a snapshot as new as the
	 * scan's
	 */
	{
		HASHCTL		actl;

		memset(&actl, 0, sizeof(actl));
		actl.keysize = sizeof(int64);
		actl.entrysize = sizeof(int64);
		actl.hcxt = CurrentMemoryContext;
		anchors = hash_create("pgjq ring verify anchors", 64, &actl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		pgjq_spi_run(&plan_verify_anchors, NULL, NULL, 0);
		for (uint64 r = 0; r < SPI_processed; r++)
		{
			int64		id = pgjq_spi_get_int64((int) r, 1);

			(void) hash_search(anchors, &id, HASH_ENTER, NULL);
		}
	}

	hash_seq_init(&hs, sc.bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
	{
		RbClaim    *c;
		char		st = durable_state(&sc, b, &c);
		int64		tok = st == 'a' ? c->token : 0;
		char	   *object = psprintf("job " INT64_FORMAT, b->id);

		m = hash_search(mem, &b->id, HASH_FIND, NULL);
		/* shared memory may point to either copy of a relocated job */
		if (st != 'f')
			open[m != NULL && (b->copies & (1 << m->slot)) ? m->slot : b->slot]++;
		if (m != NULL && st != 'f' &&
			(!(b->copies & (1 << m->slot)) ||
			 !ItemPointerEquals(&m->tid, &b->tids[m->slot])))
			verify_add(rows, &n, &max, object, psprintf("its body in slot %d", b->slot),
					   psprintf("a position in slot %d that is not its body", m->slot));
		if (st == 'f' && m != NULL)
			verify_add(rows, &n, &max, object, "finished", state_name(m->state, m->token));
		else if (st != 'f' && m == NULL)
			verify_add(rows, &n, &max, object, state_name(st, tok), "absent");
		else if (m != NULL && (m->state != st || m->token != tok))
			verify_add(rows, &n, &max, object, state_name(st, tok),
					   state_name(m->state, m->token));
		else if (m != NULL && st == 'a' && m->cancel != c->cancel)
			verify_add(rows, &n, &max, object,
					   c->cancel ? "cancellation requested" : "no cancellation requested",
					   m->cancel ? "cancellation requested" : "no cancellation requested");
		if (m != NULL)
			hash_search(mem, &b->id, HASH_REMOVE, NULL);

		/*
		 * an unfinished job with a dedup_key holds it by its anchor (a
		 * 'waiting' key only until its claim)
		 */
		if (st != 'f' && (b->anchored || (st == 'r' && b->waiting_key)) &&
			hash_search(anchors, &b->id, HASH_REMOVE, NULL) == NULL)
			verify_add(rows, &n, &max, object, "its dedup anchor in pgjq.job", "none");
	}
	hash_seq_init(&hs, anchors);
	while ((aid = hash_seq_search(&hs)) != NULL)
		verify_add(rows, &n, &max, psprintf("pgjq.job row " INT64_FORMAT, *aid),
				   "no anchor (no unfinished ring job with a dedup_key)", "an anchor");
	hash_seq_init(&hs, mem);
	while ((m = hash_seq_search(&hs)) != NULL)
		verify_add(rows, &n, &max, psprintf("job " INT64_FORMAT, m->id), "no body",
				   state_name(m->state, m->token));
	for (int s = 0; s < RING_NSLOTS; s++)
		if (open[s] != mem_open[s])
			verify_add(rows, &n, &max, psprintf("slot %d: unfinished jobs", s),
					   psprintf(INT64_FORMAT, open[s]), psprintf(INT64_FORMAT, mem_open[s]));
	verify_ring_order(&sc, mem_slot, mem_cur, rows, &n, &max);
	verify_accounting(rows, &n, &max);
	if (mem_used > pgjq_ring_positions)
		verify_add(rows, &n, &max, "ring positions: ready + reserved + being claimed",
				   psprintf("at most %d (pgjq.ring_positions)", pgjq_ring_positions),
				   psprintf(INT64_FORMAT, mem_used));
	return n;
}

#define RING_VERIFY_TRIES 20

/*
 * verify()'s ring part.  Transactions that enqueue, claim or finish ring
 * jobs meanwhile make the two differ for a moment, so a difference counts
 * only if it is still there after up to a second of tries.
 */
int
pgjq_ring_verify(PgjqVerifyRow **rows)
{
	int			n = 0;

	*rows = NULL;
	if (ring == NULL || !ensure_ready(false))
		return 0;
	for (int attempt = 0; attempt < RING_VERIFY_TRIES; attempt++)
	{
		if (attempt > 0)
		{
			pg_usleep(50000);
			CHECK_FOR_INTERRUPTS();
		}
		n = verify_once(rows);
		if (n == 0)
			break;
	}
	return n;
}

/* ---------------------------------------------------------------------
 * hot standby (or no preload): read-only answers from the tables
 * --------------------------------------------------------------------- */

/* this database has the ring's tables; their OIDs are looked up */
static bool
tables_known(void)
{
	Oid			b0 = pgjq_relation("ring_body_0");

	if (!OidIsValid(b0))
		return false;
	if (cached_db != MyDatabaseId || b0 != body_oid[0])
		lookup_oids();
	return true;
}

/*
 * The durable state of one job: the newest body by the id index, then its
 * claims and closes from a scan of the live logs (a standby reads what the
 * rebuild would).  False when the ring holds no body of the job.
 */
static bool
standby_job(int64 id, char *state, TimestampTz *lease, char **worker, bool *cancel,
			BodyRow *b)
{
	int			slot;
	ItemPointerData tid;
	Snapshot	snap;
	int64		maxtok = 0;
	bool		closed = false;

	if (!tables_known() || !body_by_id(id, b, &slot, &tid, false))
		return false;
	*lease = 0;
	*worker = NULL;
	*cancel = false;
	snap = RegisterSnapshot(read_snapshot(false));
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(log_oid[s], AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			ArrayType  *arr = DatumGetArrayTypeP(heap_getattr(tup, L_IDS, desc, &isnull));
			int			n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
			int64	   *ids = (int64 *) ARR_DATA_PTR(arr);
			int64		token;
			char		kind;

			for (int i = 0; i < n; i++)
			{
				if (ids[i] != id)
					continue;
				token = DatumGetInt64(heap_getattr(tup, L_TOKEN, desc, &isnull));
				kind = DatumGetChar(heap_getattr(tup, L_KIND, desc, &isnull));
				if (kind == 'r')
					break;		/* a relocated copy, not a claim */
				if (token > maxtok)
				{
					maxtok = token;
					closed = false;
					*lease = 0;
					*worker = NULL;
					*cancel = false;
				}
				if (token == maxtok && kind == 'q')
					*cancel = true;
				if (token == maxtok && kind != 'c' && kind != 'h' && kind != 'q')
					closed = true;
				if (token == maxtok && (kind == 'c' || kind == 'h'))
				{
					TimestampTz at = DatumGetTimestampTz(heap_getattr(tup, L_AT, desc, &isnull));

					/* as the rebuild: the latest lease of the claim's rows */
					*lease = Max(*lease, at);
				}
				if (token == maxtok && kind == 'c')
				{
					bool		wnull;
					Datum		w = heap_getattr(tup, L_WORKER, desc, &wnull);

					if (!wnull)
						*worker = TextDatumGetCString(w);
				}
				break;
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}
	UnregisterSnapshot(snap);
	if (maxtok <= b->after)
		*state = 'r';
	else
		*state = closed ? 'f' : 'a';
	return true;
}

/* per-statement cache: metrics() asks once per queue */
static HTAB *sb_counts = NULL;
static MemoryContext sb_cxt = NULL;
static LocalTransactionId sb_lxid = InvalidLocalTransactionId;
static TimestampTz sb_stmt = 0;

/* The counts of every queue of the ring, from a full scan of its tables. */
static bool
standby_scan(void)
{
	MemoryContext tmp,
				old;
	RbScan		sc;
	HASHCTL		ctl;
	HASH_SEQ_STATUS hs;
	RbBody	   *b;

	if (!tables_known())
		return false;
	if (sb_counts != NULL && sb_lxid == MyProc->lxid &&
		sb_stmt == GetCurrentStatementStartTimestamp())
		return true;
	if (sb_cxt != NULL)
		MemoryContextDelete(sb_cxt);
	sb_counts = NULL;
	sb_cxt = AllocSetContextCreate(TopMemoryContext, "pgjq ring standby counts",
								   ALLOCSET_SMALL_SIZES);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(int32);
	ctl.entrysize = sizeof(StandbyCount);
	ctl.hcxt = sb_cxt;
	sb_counts = hash_create("pgjq ring standby counts", 64, &ctl,
							HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	tmp = AllocSetContextCreate(CurrentMemoryContext, "pgjq ring standby scan",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(tmp);
	scan_tables(&sc, false);
	hash_seq_init(&hs, sc.bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
	{
		RbClaim    *c;
		char		st = durable_state(&sc, b, &c);
		bool		found;
		StandbyCount *e;

		if (st == 'f')
			continue;
		e = hash_search(sb_counts, &b->queue_id, HASH_ENTER, &found);
		if (!found)
		{
			e->ready = e->running = 0;
			e->oldest = 0;
		}
		if (st == 'a')
			e->running++;
		else
		{
			e->ready++;
			if (e->oldest == 0 || b->enqueued_at < e->oldest)
				e->oldest = b->enqueued_at;
		}
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(tmp);
	sb_lxid = MyProc->lxid;
	sb_stmt = GetCurrentStatementStartTimestamp();
	return true;
}

static bool
standby_counts(int32 queue_id, int64 *ready, int64 *running, TimestampTz *oldest)
{
	StandbyCount *e;

	if (!standby_scan())
		return false;
	e = hash_search(sb_counts, &queue_id, HASH_FIND, NULL);
	if (e != NULL)
	{
		*ready = e->ready;
		*running = e->running;
		*oldest = e->oldest;
	}
	return true;
}

/*
 * limits.c's count at the first call, of a queue that gets a key limit, and
 * its verify(): the running ring jobs of this database per (queue, key),
 * keys as pgjq_limits_key_hash (arrays in the caller's context; a key may
 * come once per priority, and a queue's count is the sum of its rows).
 * queue_id 0 means every queue.  Rebuilds the ring first if it is not yet.
 */
int
pgjq_ring_running_keys(int32 queue_id, int32 **qids, uint64 **hashes, int64 **counts)
{
	HASH_SEQ_STATUS hs;
	RingLane   *l;
	int			n = 0,
				max;

	*qids = NULL;
	*hashes = NULL;
	*counts = NULL;
	if (ring == NULL || !ensure_ready(false))
		return 0;
	max = pgjq_ring_max_lanes;
	*qids = palloc(sizeof(int32) * max);
	*hashes = palloc(sizeof(uint64) * max);
	*counts = palloc(sizeof(int64) * max);
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_lanes);
	while ((l = hash_seq_search(&hs)) != NULL)
	{
		if (l->key.dbid != MyDatabaseId || l->running == 0 || n >= max ||
			(queue_id != 0 && l->key.queue_id != queue_id))
			continue;
		(*qids)[n] = l->key.queue_id;
		(*hashes)[n] = ring_limits_hash(l->key.keyhash);
		(*counts)[n] = l->running;
		n++;
	}
	LWLockRelease(ring->lock);
	return n;
}

bool
pgjq_ring_claimable(int32 queue_id)
{
	RingQueue  *q;
	bool		any;

	if (ring == NULL || !ensure_ready(false))
		return false;
	ring_holds_expire_due();
	LWLockAcquire(ring->lock, LW_SHARED);
	q = ring_queue_get(queue_id, false);
	any = q != NULL && ring_queue_claimable(q);
	LWLockRelease(ring->lock);
	return any;
}
