/*-------------------------------------------------------------------------
 *
 * ring_standby.c
 *	  Read-only answers from the ring's tables, where shared memory
 *	  holds no ring state (a hot standby, or a server without the preload) or
 *	  does not answer as of the reader's snapshot (REPEATABLE READ).
 *
 * One job: its newest body by the id index, then its claims and closes from
 * a scan of the live logs, read as the rebuild would.  The counts of every
 * queue: one scan of the live slots per statement (ring_scan_tables), cached
 * for the rest of it (metrics() asks once per queue).  No lock but the
 * tables' AccessShareLock.
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
 * hot standby (or no preload): read-only answers from the tables
 * --------------------------------------------------------------------- */
/*
 * The durable state of one job: the newest body by the id index, then its
 * claims and closes from a scan of the live logs (a standby reads what the
 * rebuild would).  False when the ring holds no body of the job.
 */
bool
ring_standby_job(int64 id, char *state, TimestampTz *lease, char **worker, bool *cancel,
				 BodyRow *b)
{
	int			slot;
	ItemPointerData tid;
	Snapshot	snap;
	int64		maxtok = 0;
	bool		closed = false;

	if (!ring_tables_known() || !ring_body_by_id(id, b, &slot, &tid, false))
		return false;
	*lease = 0;
	*worker = NULL;
	*cancel = false;
	snap = RegisterSnapshot(ring_read_snapshot(false));
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	rel = table_open(ring_log_oid[s], AccessShareLock);
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

/*
 * The counts of every queue of the ring, from a full scan of its tables
 * (queue_id -> StandbyCount, valid for the statement); NULL without the
 * ring's tables.
 */
HTAB *
ring_standby_scan(void)
{
	MemoryContext tmp,
				old;
	RbScan		sc;
	HASHCTL		ctl;
	HASH_SEQ_STATUS hs;
	RbBody	   *b;

	if (!ring_tables_known())
		return NULL;
	if (sb_counts != NULL && sb_lxid == PGJQ_MY_LXID &&
		sb_stmt == GetCurrentStatementStartTimestamp())
		return sb_counts;
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
	ring_scan_tables(&sc, false);
	hash_seq_init(&hs, sc.bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
	{
		RbClaim    *c;
		char		st = ring_durable_state(&sc, b, &c);
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
	sb_lxid = PGJQ_MY_LXID;
	sb_stmt = GetCurrentStatementStartTimestamp();
	return sb_counts;
}

bool
ring_standby_counts(int32 queue_id, int64 *ready, int64 *running, TimestampTz *oldest)
{
	HTAB	   *counts = ring_standby_scan();
	StandbyCount *e;

	if (counts == NULL)
		return false;
	e = hash_search(counts, &queue_id, HASH_FIND, NULL);
	if (e != NULL)
	{
		*ready = e->ready;
		*running = e->running;
		*oldest = e->oldest;
	}
	return true;
}
