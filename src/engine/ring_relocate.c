/*-------------------------------------------------------------------------
 *
 * ring_relocate.c
 *	  Space back: truncation of the oldest slot in use once its jobs
 *	  are finished, and relocation of its stragglers into the current slot
 *	  so that it can be truncated (the worker's "ring space" step and
 *	  pgjq._ring_reclaim()).
 *
 * A slot is truncated, body and log together, only while it is the oldest
 * slot in use (the one after the current slot in ring order, or the next
 * non-clean one after it), sealed, with no unfinished job (open = 0) and no
 * open transaction registered as its writer; then every log row in it refers
 * to a finished job in it.  The truncating transaction holds
 * AccessExclusiveLock on both tables (taken without waiting); the slot is
 * clean when it commits.  Claims and completions truncate only in a
 * transaction of their own statement (ring_client_truncate); in a
 * transaction block they wake the worker instead.
 *
 * Relocation copies the unfinished jobs of the oldest slot forward under a
 * SHARE UPDATE EXCLUSIVE lock on its bodies; the ring's LWLock is held only
 * while the stragglers are listed (shared) and never over I/O.
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
	if (!ConditionalLockRelationOid(ring_body_oid[s], AccessExclusiveLock) ||
		!ConditionalLockRelationOid(ring_log_oid[s], AccessExclusiveLock))
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
void
ring_client_truncate(void)
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
 * ring_xact.c); until then, and if it rolls back, the old rows serve.  A
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
	if (c < 0 || !ConditionalLockRelationOid(ring_body_oid[c], ShareUpdateExclusiveLock))
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
	rel = table_open(ring_body_oid[c], AccessShareLock);
	for (int i = 0; i < n; i++)
	{
		ring_body_fetch(rel, st[i].id, &st[i].tid, &rows[i]);
		ids[i] = st[i].id;
	}
	table_close(rel, NoLock);

	/* the current slot cannot move on meanwhile: its next one is c */
	s = ring_slot_for_write(n);
	Assert(s != c);
	ring_body_append(s, n, rows, tids);
	ring_log_append_to(s, 0, now, 'r', ids, n, NULL, 0, NULL);
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
		ring_log_append_to(s, st[i].token, st[i].lease_until, 'c', ids, m,
						   ring_claim_worker(st[i].claim_slot, &st[i].claim_tid, st[i].token),
						   st[i].deadline, &ctid);
		for (int j = i; j < n; j++)
			if (st[j].token == st[i].token && st[j].lease_until == st[i].lease_until &&
				st[j].deadline == st[i].deadline)
				st[j].claim_tid = ctid;
	}
	/* and the cancellation requests, whose 'q' rows go with the old slot too */
	for (int i = n - nflight; i < n; i++)
		if (st[i].cancel)
			ring_log_append_to(s, st[i].token, now, 'q', &st[i].id, 1, NULL, 0, NULL);

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

	if (ring == NULL || !ring_ensure_ready(false))
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
		ring_forget_gone_databases();
	}
	if (maybe_truncate())
		return 1;
	return relocate(Max(limit, 1));
}
