/*-------------------------------------------------------------------------
 *
 * ring_verify.c
 *	  verify()'s ring part: this database's shared memory against its
 *	  tables, and the shared accounting of all databases.
 *
 * Order: the live slots are scanned (ring_scan_tables); shared memory is
 * copied under the ring's LWLock (shared, no allocation but the hash's); the
 * dedup anchors are read from pgjq.job; then the two are compared without
 * the lock.  A difference counts only if it is still there after up to a
 * second of tries (transactions in progress make them differ for a moment).
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
	char	   *first_bad_prio = NULL;
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
			bool		found;

			/* dynahash leaves a new entry's value as it found the memory */
			e = hash_search(per_prio, &l->prio, HASH_ENTER, &found);
			if (!found)
				*(int64 *) (e + sizeof(RingPrio *)) = 0;
			(*(int64 *) (e + sizeof(RingPrio *)))++;
		}
	}
	hash_seq_init(&hs, ring_prios);
	while ((pr = hash_seq_search(&hs)) != NULL)
	{
		char	   *e = hash_search(per_prio, &pr, HASH_FIND, NULL);
		int64		lanes = e ? *(int64 *) (e + sizeof(RingPrio *)) : 0;

		if (lanes != pr->nlanes || lanes == 0)
		{
			if (bad_nlanes == 0)
				first_bad_prio = psprintf("database %u, queue_id %d, priority %d: %d lanes point to it, it counts " INT64_FORMAT,
										  pr->key.dbid, pr->key.queue_id, pr->key.priority,
										  (int) lanes, (int64) pr->nlanes);
			bad_nlanes++;
		}
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
				   psprintf(INT64_FORMAT " records differ (the first: %s)", bad_nlanes, first_bad_prio));
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
	ring_scan_tables(&sc, true);
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
		char		st = ring_durable_state(&sc, b, &c);
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
	if (ring == NULL || !ring_ensure_ready(false))
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
