/*-------------------------------------------------------------------------
 *
 * ring_enqueue.c
 *	  Enqueue into the ring: bodies appended to the current slot
 *	  and published at commit (for enqueue, and for promotion).
 *
 * Order: jobs with a dedup_key first insert their anchor into pgjq.job (its
 * unique index decides); then the bodies are appended (one heap_insert, or
 * heap_multi_insert for a batch); then, under the ring's LWLock (exclusive),
 * room for their positions is reserved and their lanes pinned, so that the
 * commit callback (ring_xact.c), which puts them in their lanes, cannot
 * fail.  A bound that is reached raises before anything is published.
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
 * enqueue
 * --------------------------------------------------------------------- */
/*
 * Append n bodies of one queue to the current slot and publish them when
 * the transaction commits: room for their positions is reserved and their
 * lanes pinned now, so that the commit callback cannot fail; a bound that
 * is reached raises here, before anything is published.  For enqueue and
 * for the promotion of due jobs from pgjq.job.
 */
void
ring_append_and_publish(int32 queue_id, int n, BodyRow *rows)
{
	ItemPointerData *tids = palloc(sizeof(ItemPointerData) * n);
	RingLaneKey *keys = palloc(sizeof(RingLaneKey) * n);
	RingLane  **lanes = palloc(sizeof(RingLane *) * n);
	int			s;
	int			pinned = 0;
	const char *full = NULL;

	for (int i = 0; i < n; i++)
		ring_body_lane_key(&rows[i], &keys[i]);
	s = ring_slot_for_write(n);
	ring_body_append(s, n, rows, tids);

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
	if (!ring_ensure_ready(true))
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
			b->id = nextval_internal(ring_jobseq_oid, false);
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
		ring_append_and_publish(queue_id, m, rows);
}
