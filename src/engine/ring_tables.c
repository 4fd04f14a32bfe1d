/*-------------------------------------------------------------------------
 *
 * ring_tables.c
 *	  The ring engine's tables: the relation OIDs of this database,
 *	  bodies appended to a slot (heap_insert, heap_multi_insert for batches,
 *	  one btree on id) and read back by position or by id, ring_log rows
 *	  written to a slot, the slot to write to now, and the dedup anchors of
 *	  jobs that ended.
 *
 * Slots: pgjq.ring_body_N and pgjq.ring_log_N form slot N.  Producers append
 * to the current slot until it holds pgjq.ring_slot_rows bodies, then move to
 * the next one if it is clean (otherwise the current slot keeps growing).
 * Every row goes to the slot current when it is written, so a log row never
 * refers to a body in a newer slot.  ring_slot_for_write registers the
 * transaction as the slot's writer (it is not truncated before the
 * transaction ends) and writes the slot's 'g' row of its generation first if
 * no committed one exists yet.
 *
 * Locking: the ring's LWLock only around the slot's record in shared memory
 * (exclusive, no I/O under it: the xid is assigned before it); the tables
 * take RowExclusiveLock to write and AccessShareLock to read, kept to the end
 * of the transaction.  A body at a published position is read without an
 * MVCC test (publication proves it); reads by id use ring_read_snapshot.
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

/* relation OIDs of this database, looked up once per backend and database */
Oid			ring_cached_db = InvalidOid;
Oid			ring_body_oid[RING_NSLOTS];
Oid			ring_log_oid[RING_NSLOTS];
Oid			ring_jobseq_oid;
static Oid	tokseq_oid;

void
ring_lookup_oids(void)
{
	char		name[NAMEDATALEN];

	for (int i = 0; i < RING_NSLOTS; i++)
	{
		snprintf(name, sizeof(name), "ring_body_%d", i);
		ring_body_oid[i] = pgjq_relation(name);
		snprintf(name, sizeof(name), "ring_log_%d", i);
		ring_log_oid[i] = pgjq_relation(name);
		if (!OidIsValid(ring_body_oid[i]) || !OidIsValid(ring_log_oid[i]))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_TABLE),
					 errmsg("the tables of pgjq's ring engine are missing"),
					 errhint("Update the extension: ALTER EXTENSION pgjq UPDATE.")));
	}
	ring_jobseq_oid = pgjq_relation("job_id_seq");
	tokseq_oid = pgjq_relation("token_seq");
	ring_cached_db = MyDatabaseId;
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
int
ring_slot_for_write(int appending)
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
		ring_log_append_to(s, (int64) mark, GetCurrentTimestamp(), 'g', NULL, 0, NULL, 0, NULL);
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
void
ring_body_read(HeapTuple tup, TupleDesc desc, BodyRow *b)
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
void
ring_body_fetch(Relation rel, int64 id, ItemPointer tid, BodyRow *b)
{
	HeapTupleData tup;
	Buffer		buf;

	tup.t_self = *tid;
	if (!heap_fetch(rel, SnapshotAny, &tup, &buf, false))
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the body of job " INT64_FORMAT " is missing", id)));
	ring_body_read(&tup, RelationGetDescr(rel), b);
	ReleaseBuffer(buf);
	if (b->id != id)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("pgjq ring: the position of job " INT64_FORMAT " holds job " INT64_FORMAT,
						id, b->id)));
}

/* the lane key of a body */
void
ring_body_lane_key(const BodyRow *b, RingLaneKey *k)
{
	text	   *t = b->fair_key ? DatumGetTextPP(b->fair_key) : NULL;

	ring_lane_key(k, b->queue_id, b->priority, t ? VARDATA_ANY(t) : NULL,
				  t ? VARSIZE_ANY_EXHDR(t) : 0);
}

/*
 * Append n bodies to slot s (heap_insert for one, heap_multi_insert for
 * more, then the id index), their positions into tids.
 */
void
ring_body_append(int s, int n, const BodyRow *rows, ItemPointerData *tids)
{
	Relation	rel = table_open(ring_body_oid[s], RowExclusiveLock);
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
		pgjq_index_insert_cleanup(idx, ii);
		index_close(idx, NoLock);
	}
	table_close(rel, NoLock);
}

ArrayType *
ring_int8_array(const int64 *v, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * Max(n, 1));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(v[i]);
	return construct_array(d, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

/*
 * One ring_log row into slot s; worker and deadline only for claims ('c'),
 * NULL and 0 for none.  Its position goes to *tid when tid is given.
 */
void
ring_log_append_to(int s, int64 token, TimestampTz at, char kind, const int64 *ids, int n,
				   const char *worker, TimestampTz deadline, ItemPointer tid)
{
	Relation	rel = table_open(ring_log_oid[s], RowExclusiveLock);
	Datum		values[L_NATTS];
	bool		nulls[L_NATTS] = {false, false, false, false, worker == NULL, deadline == 0};
	HeapTuple	tup;

	values[L_TOKEN - 1] = Int64GetDatum(token);
	values[L_AT - 1] = TimestampTzGetDatum(at);
	values[L_KIND - 1] = CharGetDatum(kind);
	values[L_IDS - 1] = PointerGetDatum(ring_int8_array(ids, n));
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
void
ring_log_append(int64 token, TimestampTz at, char kind, const int64 *ids, int n)
{
	ring_log_append_to(ring_slot_for_write(0), token, at, kind, ids, n, NULL, 0, NULL);
}

/*
 * The worker named by the claim row at (slot, tid), if it is the 'c' row of
 * `token` (in the current memory context); NULL when it names none or the
 * row is not that claim's any more (its slot was truncated).  For job(id)
 * and relocation; the caller holds no ring lock.
 */
char *
ring_claim_worker(int slot, ItemPointer tid, int64 token)
{
	Relation	rel;
	HeapTupleData tup;
	Buffer		buf;
	char	   *worker = NULL;

	if (slot < 0 || slot >= RING_NSLOTS || !ItemPointerIsValid(tid))
		return NULL;
	rel = table_open(ring_log_oid[slot], AccessShareLock);
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
void
ring_log_closes(char kind, TimestampTz at, int n, const int64 *ids, const int64 *toks)
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
		ring_log_append(toks[i], at, kind, grp, m);
	}
}

int64
ring_next_token(int64 *token)
{
	if (*token == 0)
		*token = nextval_internal(tokseq_oid, false);
	return *token;
}

/* the dedup anchors of jobs that ended: their keys are free again */
static PgjqPlan plan_anchors_end = {
	"DELETE FROM pgjq.job WHERE id = ANY ($1) AND state = 'n'",
	1, {INT8ARRAYOID}, NULL, true
};

void
ring_anchors_end(int n, const int64 *ids)
{
	Datum		v[1];

	if (n == 0)
		return;
	v[0] = PointerGetDatum(ring_int8_array(ids, n));
	pgjq_spi_run(&plan_anchors_end, v, NULL, 0);
}

/*
 * The snapshot of the reads that answer from the ring's tables (job(),
 * queue_stats and metrics() on a standby, and in a REPEATABLE READ or
 * SERIALIZABLE transaction): that transaction's own, so that ring jobs are
 * seen as of the same moment as the rows of pgjq.job and the history in
 * the same query (shared memory holds only the present); else the latest.
 * The rebuild and the writers always read the latest.
 */
Snapshot
ring_read_snapshot(bool latest)
{
	return !latest && IsolationUsesXactSnapshot() ? GetTransactionSnapshot() : GetLatestSnapshot();
}

/* The newest body of a job (by the id index of each slot), or false. */
bool
ring_body_by_id(int64 id, BodyRow *out, int *slot, ItemPointerData *tid, bool latest)
{
	bool		found = false;
	Snapshot	snap = RegisterSnapshot(ring_read_snapshot(latest));

	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(ring_body_oid[s], AccessShareLock);
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
		scan = pgjq_index_beginscan(rel, idx, snap, 1, 0);
		index_rescan(scan, &key, 1, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, ts))
		{
			bool		shouldfree;
			HeapTuple	tup = ExecFetchSlotHeapTuple(ts, false, &shouldfree);
			BodyRow		b;

			ring_body_read(tup, RelationGetDescr(rel), &b);
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

/* this database has the ring's tables; their OIDs are looked up */
bool
ring_tables_known(void)
{
	Oid			b0 = pgjq_relation("ring_body_0");

	if (!OidIsValid(b0))
		return false;
	if (ring_cached_db != MyDatabaseId || b0 != ring_body_oid[0])
		ring_lookup_oids();
	return true;
}
