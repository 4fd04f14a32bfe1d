/*-------------------------------------------------------------------------
 *
 * key_holds.c
 *	  The durable rows of held fair keys, pgjq.key_holds: a hold or a
 *	  release writes its row here and notes the change of the shared entry
 *	  (state/ring_holds.c), which takes it at commit; the ring's rebuild
 *	  reads the rows still in the future.
 *
 * Order of operations: the row first (its lock serializes two changes of
 * one key), then the note; an abort undoes both.  ring_holds_read runs
 * with no lock held (ring->lock is never held across heap access).
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring.h"
#include "engine/storage_internal.h"
#include "state/ring_internal.h"
#include "state/wait.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

static PgjqPlan plan_hold = {
	"INSERT INTO pgjq.key_holds (queue_id, fair_key, until) VALUES ($1, $2, $3)"
	" ON CONFLICT (queue_id, fair_key) DO UPDATE SET until = excluded.until",
	3, {INT4OID, TEXTOID, TIMESTAMPTZOID}
};

static PgjqPlan plan_release = {
	"DELETE FROM pgjq.key_holds WHERE queue_id = $1 AND fair_key = $2 AND until > $3",
	3, {INT4OID, TEXTOID, TIMESTAMPTZOID}
};

void
pgjq_key_hold(int32 queue_id, const char *fair_key, TimestampTz until)
{
	Datum		values[3] = {Int32GetDatum(queue_id), CStringGetTextDatum(fair_key),
	TimestampTzGetDatum(until)};

	pgjq_spi_run(&plan_hold, values, NULL, 0);
	ring_holds_note_change(queue_id, fair_key, until);
}

bool
pgjq_key_release(int32 queue_id, const char *fair_key)
{
	Datum		values[3] = {Int32GetDatum(queue_id), CStringGetTextDatum(fair_key),
	TimestampTzGetDatum(GetCurrentTimestamp())};

	pgjq_spi_run(&plan_release, values, NULL, 0);
	if (SPI_processed == 0)
		return false;
	ring_holds_note_change(queue_id, fair_key, 0);
	/* its ready jobs are claimable again once this commits */
	pgjq_wait_note_ready(queue_id, PG_INT32_MAX);
	return true;
}

/*
 * The rebuild, in two steps since ring->lock is never held across heap
 * access: the holds of pgjq.key_holds still in the future (no lock held),
 * then into ring_holds, after the database's entries were cleared and
 * before its lanes are settled (lock held exclusively).  Rows beyond the
 * room are not held: ring_holds_install returns how many, for a warning
 * after the lock is released.
 */
int
ring_holds_read(RingHoldRow **rows)
{
	Oid			relid = pgjq_relation("key_holds");
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	TimestampTz now = GetCurrentTimestamp();
	Snapshot	snap;
	int			n = 0;
	int			max = 16;

	*rows = palloc(sizeof(RingHoldRow) * max);
	if (!OidIsValid(relid))
		return 0;
	rel = table_open(relid, AccessShareLock);
	snap = RegisterSnapshot(GetLatestSnapshot());
	scan = table_beginscan(rel, snap, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		TupleDesc	desc = RelationGetDescr(rel);
		bool		isnull;
		TimestampTz until = DatumGetTimestampTz(heap_getattr(tup, 3, desc, &isnull));
		RingHoldKey k;

		if (until <= now)
			continue;
		ring_hold_key_of(&k, DatumGetInt32(heap_getattr(tup, 1, desc, &isnull)),
						 TextDatumGetCString(heap_getattr(tup, 2, desc, &isnull)));
		if (n == max)
		{
			max *= 2;
			*rows = repalloc(*rows, sizeof(RingHoldRow) * max);
		}
		(*rows)[n].queue_id = k.queue_id;
		(*rows)[n].keyhash = k.keyhash;
		(*rows)[n].until = until;
		n++;
	}
	table_endscan(scan);
	UnregisterSnapshot(snap);
	table_close(rel, AccessShareLock);
	return n;
}
