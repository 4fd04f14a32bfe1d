/*-------------------------------------------------------------------------
 *
 * ring_rebuild.c
 *	  The first ring call of a database after a start: shared memory
 *	  made to match the tables (ring_ensure_ready), from a scan of the live
 *	  slots (ring_scan_tables, also verify()'s and the standby's).
 *
 * Versions and the rebuild: a job's claim is the largest token logged for
 * its id ('c' rows, and every closing row, which implies its claim) that is
 * above the after_token of the job's newest body.  No such claim: ready.
 * That claim closed ('d', 'f' or 'x'): finished.  Otherwise in flight until
 * the latest lease of its 'c' and 'h' rows ('q': its cancellation was
 * requested): a job leased before a crash is not handed to
 * anyone else before that lease ends.  The rebuild scans the live slots in
 * full (about 1.8 microseconds per live body row: 330,803 in 594 ms after
 * bench/fr1/run's turned phase) at the first ring call of a database after a start, under ExclusiveLock on
 * pgjq.ring_log_0 so that concurrent first calls wait for it.
 *
 * Order: records of dropped databases freed, the OIDs looked up, this
 * database's record found or made; if it is not ready, ExclusiveLock on
 * ring_log_0, the logs scanned then the bodies, the held keys read, and
 * then, under the ring's LWLock (exclusive), the record cleared and every
 * unfinished job put back in its lane or the in-flight table.
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

static void rebuild(void);

/* Are all ring tables of this database empty? */
static bool
rings_empty(void)
{
	for (int s = 0; s < RING_NSLOTS; s++)
	{
		Relation	b = RelationIdGetRelation(ring_body_oid[s]);
		Relation	l = RelationIdGetRelation(ring_log_oid[s]);
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
void
ring_forget_gone_databases(void)
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
bool
ring_ensure_ready(bool must)
{
	RingDb	   *db;
	bool		ok;

	pgjq_ring_require();
	/* a standby keeps no ring state; writes fail as read-only anyway */
	if (RecoveryInProgress())
		return false;
	/* the OIDs change when the extension is dropped and created again */
	if (ring_cached_db != MyDatabaseId || pgjq_relation("ring_body_0") != ring_body_oid[0])
	{
		/* a 0.1.0 schema under this library: no ring in this database */
		if (!OidIsValid(pgjq_relation("ring_body_0")))
		{
			if (must)
				ring_lookup_oids(); /* raises */
			return false;
		}
		ring_lookup_oids();
	}
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	db = ring_db();
	LWLockRelease(ring->lock);
	if (db == NULL)
	{
		/* free the records of databases that were dropped, then look again */
		ring_forget_gone_databases();
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
	ok = db->ready && db->incarnation == ring_body_oid[0];
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
	ring_forget_gone_databases();
	LockRelationOid(ring_log_oid[0], ExclusiveLock);
	LWLockAcquire(ring->lock, LW_SHARED);
	db = ring_db_find();
	ok = db != NULL && db->ready && db->incarnation == ring_body_oid[0];
	LWLockRelease(ring->lock);
	if (!ok)
		rebuild();
	UnlockRelationOid(ring_log_oid[0], ExclusiveLock);
	return true;
}

/* ---------------------------------------------------------------------
 * rebuild: shared memory from the durable rows
 * --------------------------------------------------------------------- */

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
 * the slot got when producers moved to it (ring_slot_for_write).  A slot with
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

/* Scan the live slots (in the current memory context); ring_read_snapshot(latest). */
void
ring_scan_tables(RbScan *sc, bool latest)
{
	Snapshot	snap = RegisterSnapshot(ring_read_snapshot(latest));
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
		Relation	rel = table_open(ring_log_oid[s], AccessShareLock);
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
		Relation	rel = table_open(ring_body_oid[s], AccessShareLock);
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

				ring_body_read(tup, desc, &r);
				b->after = after;
				b->queue_id = r.queue_id;
				b->attempt = r.attempt;
				b->enqueued_at = r.enqueued_at;
				b->tid = tup->t_self;
				b->slot = s;
				b->copies = 0;
				b->anchored = BODY_ANCHORED_RUNNING(&r);
				b->waiting_key = r.dedup_key != (Datum) 0 && r.dedup_scope == 'w';
				ring_body_lane_key(&r, &b->key);
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
char
ring_durable_state(RbScan *sc, RbBody *b, RbClaim **claim)
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

	ring_scan_tables(&sc, true);
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
		if (ring_durable_state(&sc, b, &c) == 'f')
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
	db->incarnation = ring_body_oid[0];
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
