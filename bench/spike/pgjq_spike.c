/*-------------------------------------------------------------------------
 *
 * pgjq_spike.c
 *	  Stage-1 spike of pgjq's target storage engine (issue 7): job bodies
 *	  appended once to a ring of plain tables by direct heap access, a
 *	  producer's jobs published to a shared-memory lane by its commit
 *	  callback, claims taken from shared memory (never from a heap scan),
 *	  one compact ledger row per claim call and one compact row per outcome
 *	  call, space back by TRUNCATE of a ring slot.  No UPDATE, no DELETE.
 *
 *	  Stage 2 of the spike adds what the engine's correctness rests on
 *	  beyond the hot path: fail and rescue of an expired lease append a new
 *	  version of the job (same id, attempt + 1, after_token = the claim it
 *	  closes), heartbeats write a ledger row, and the shared-memory state is
 *	  rebuilt from the durable rows after a crash or restart (a full scan of
 *	  the live ring, the ledger and the outcome rows).
 *
 *	  Throwaway: one queue, one lane, no history retention (ledger and done
 *	  only grow), no backoff (a failed job is ready again at once).  See
 *	  bench/spike/README.md.
 *
 * Locking rules (the whole file):
 *	  - One LWLock (spike->lock) protects every shared field: the lane (a
 *		bounded deque of published positions), the in-flight hash, the slot
 *		counters.  It is never held across heap access, WAL, a heavyweight
 *		lock wait or anything that can ERROR, except the PRE_COMMIT capacity
 *		check, which releases it before it raises.
 *	  - Each job position is in exactly one place: a producer's local pending
 *		list (not yet committed), the lane (committed, claimable), the
 *		in-flight hash as CLAIMING (claimed by an open transaction), OPEN
 *		(claim committed), EXTENDING (an open transaction heartbeats it),
 *		CLOSING (an open transaction completes, fails or rescues it), or
 *		gone (completion committed; a failed or rescued job's new version
 *		is then a new position, published by the same commit).  Moves between them happen under the
 *		lock, in a function call or in a commit/abort callback; callbacks
 *		never allocate or fail (lane capacity is reserved at PRE_COMMIT,
 *		in-flight entries are created at claim time).
 *	  - A body slot is truncated only when it is sealed (not the current
 *		slot), no producer is registered as its writer, and its open count
 *		(committed jobs not yet completed) is 0.  The truncating transaction
 *		also holds AccessExclusiveLock on it (taken without waiting); the slot
 *		becomes reusable only when that transaction commits.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/relscan.h"
#include "access/stratnum.h"
#include "utils/fmgroids.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

PG_MODULE_MAGIC;

#define SPIKE_NSLOTS 4
#define SPIKE_MULTI_CHUNK 1000	/* heap_multi_insert batch, as COPY uses */

/* columns of a body slot (pgjq_spike--0.1.sql) */
#define BODY_ID 1
#define BODY_AFTER 2
#define BODY_ENQUEUED 3
#define BODY_ATTEMPT 4
#define BODY_PRIORITY 5
#define BODY_FAIRKEY 6
#define BODY_PAYLOAD 7
#define BODY_NATTS 7

#define FAIR_KEY_LEN 48			/* bytes of a fair key, terminator included */
#define MAX_PRIOS 32			/* distinct priorities (the spike's bound) */

/* a published position: which job, where its body is */
typedef struct LaneEntry
{
	int64		id;
	ItemPointerData tid;
	uint16		slot;
} LaneEntry;

/*
 * A lane: the ready jobs of one (priority, fair key), in publication order,
 * as a list of nodes of the shared pool.  Lanes with jobs that may run are
 * linked in their priority's ring; a claim takes one job per lane per turn
 * of the ring (the first of every key, then the second, ...).  A lane whose
 * key has pgjq_spike.key_concurrency jobs running is unlinked (parked):
 * claims never see its jobs until a closure of the key commits.
 */
typedef struct LaneKey
{
	int16		priority;
	char		fair_key[FAIR_KEY_LEN]; /* zero-padded: the key is hashed as
										 * bytes */
} LaneKey;

typedef struct Lane
{
	LaneKey		key;			/* hash key */
	int32		head;			/* first node, -1 when empty */
	int32		tail;
	int32		count;			/* ready jobs */
	int32		running;		/* its jobs in the in-flight table */
	int32		pinned;			/* positions committing producers will push */
	bool		linked;			/* in its priority's ring */
	struct Lane *prev;			/* ring links (shared memory is mapped at the */
	struct Lane *next;			/* same address in every backend) */
} Lane;

typedef struct PosNode
{
	LaneEntry	e;
	int32		next;
} PosNode;

typedef struct PrioRing
{
	int16		priority;
	Lane	   *head;			/* next lane to take from; NULL when none */
} PrioRing;

typedef enum
{
	IF_CLAIMING,				/* claimed by xid, not committed */
	IF_OPEN,					/* claim committed: the token is valid */
	IF_EXTENDING,				/* heartbeated by xid, not committed */
	IF_CLOSING					/* completed, failed or rescued by xid, not
								 * committed */
} InFlightState;

typedef struct InFlight
{
	int64		id;				/* hash key */
	int64		token;
	TimestampTz lease_until;
	TransactionId xid;			/* owner while CLAIMING or CLOSING */
	ItemPointerData tid;
	uint16		slot;
	uint8		state;
	Lane	   *lane;			/* its running count is one of this entry */
} InFlight;

typedef struct SlotState
{
	int64		open;			/* committed jobs in the slot not yet completed */
	int64		appended;		/* rows appended (committed or not) since empty */
	int32		writers;		/* transactions that may still append to it */
	bool		sealed;			/* no longer current: waits for open = 0 */
	bool		clean;			/* empty (truncated, committed) and not in use */
	bool		truncating;		/* a transaction is truncating it */
} SlotState;

typedef struct SpikeShared
{
	LWLock	   *lock;
	ConditionVariable wake;		/* broadcast by commits that made jobs
									 * claimable */
	ConditionVariable due;		/* broadcast by commits that scheduled a job
								 * earlier than next_due */
	bool		ready;			/* set by spike_reset(): state matches tables */
	Oid			dbid;
	int			cur_slot;
	SlotState	slots[SPIKE_NSLOTS];
	/* ready positions: lanes of nodes from a pool of lane_capacity */
	int64		count;			/* ready positions in all lanes */
	int32		free_head;		/* free nodes, linked by next */
	int32		nrings;
	PrioRing	rings[MAX_PRIOS];	/* by priority, ascending */
	int64		reserved;		/* capacity reserved by committing producers */
	int64		held;			/* CLAIMING entries (they return on abort) */
	/* counters */
	int64		published;
	int64		claimed;
	int64		completed;
	int64		stale;
	int64		returned;
	int64		truncations;
	int64		ring_full;
	int64		rescued;
	int64		failed;
	int64		rebuilds;
	int64		relocated;
	int64		promoted;
	TimestampTz next_due;		/* earliest scheduled run_at; 0 = unknown,
								 * look now; DT_NOEND = none */
	uint64		due_gen;		/* bumped by every commit that lowers it */
	PosNode		nodes[FLEXIBLE_ARRAY_MEMBER];
} SpikeShared;

/* settings */
static int	lane_capacity = 1048576;
static int	max_in_flight = 65536;
static int	slot_rows = 100000;
static int	relocate_max = 1000;
static int	max_lanes = 65536;
static int	key_concurrency = 0;

static SpikeShared *spike = NULL;
static HTAB *inflight = NULL;
static HTAB *lanes = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* ---------------------------------------------------------------------
 * backend-local state of the current transaction
 * --------------------------------------------------------------------- */
typedef struct PendingEnq
{
	LaneEntry	e;
	int			level;
	LaneKey		key;
	Lane	   *lane;			/* resolved and pinned at PRE_COMMIT */
} PendingEnq;

typedef struct PendingId
{
	int64		id;
	int			level;
	bool		was_claiming;	/* a close of this transaction's own claim */
} PendingId;

static PendingEnq *p_enq = NULL;
static int	n_enq = 0,
			max_enq = 0;
static PendingId *p_claim = NULL;
static int	n_claim = 0,
			max_claim = 0;
static PendingId *p_close = NULL;
static int	n_close = 0,
			max_close = 0;

/* a heartbeat of this transaction: the lease to set at commit */
typedef struct PendingExt
{
	int64		id;
	TimestampTz lease_until;
	int			level;
} PendingExt;

static PendingExt *p_ext = NULL;
static int	n_ext = 0,
			max_ext = 0;
static int64 my_rescued = 0;
static int64 my_failed = 0;

/* delayed jobs of this transaction, and its promotion pass */
static bool my_due = false;
static TimestampTz my_due_min = 0;
static bool my_promoting = false;
static int64 my_promoted = 0;
static uint64 my_due_gen = 0;
static TimestampTz my_next_due = 0;

/* a relocated in-flight job: its copy, which commit makes its position */
typedef struct PendingReloc
{
	int64		id;
	int64		token;
	ItemPointerData tid;
	uint16		old_slot;
	uint16		slot;
	int			level;
} PendingReloc;

static PendingReloc *p_reloc = NULL;
static int	n_reloc = 0,
			max_reloc = 0;
static bool my_writer[SPIKE_NSLOTS];
static bool any_writer = false;
static int64 my_reserved = 0;
static int	my_truncating = -1;
static int	my_truncating_level = 0;

/* relation OIDs, looked up once per backend */
static Oid	cached_db = InvalidOid;
static Oid	body_oid[SPIKE_NSLOTS];
static Oid	ledger_oid,
			done_oid,
			sched_oid,
			sched_idx_oid,
			jobseq_oid,
			tokseq_oid;

void		_PG_init(void);
static void lanes_clear(void);

/* ---------------------------------------------------------------------
 * shared memory
 * --------------------------------------------------------------------- */
static Size
spike_struct_size(void)
{
	return add_size(offsetof(SpikeShared, nodes),
					mul_size(lane_capacity, sizeof(PosNode)));
}

static void
spike_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(spike_struct_size(),
											 hash_estimate_size(max_in_flight, sizeof(InFlight))),
									hash_estimate_size(max_lanes, sizeof(Lane))));
	RequestNamedLWLockTranche("pgjq_spike", 1);
}

static void
spike_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	spike = ShmemInitStruct("pgjq_spike", spike_struct_size(), &found);
	if (!found)
	{
		memset(spike, 0, offsetof(SpikeShared, nodes));
		spike->lock = &(GetNamedLWLockTranche("pgjq_spike"))->lock;
		ConditionVariableInit(&spike->wake);
		ConditionVariableInit(&spike->due);
		lanes_clear();
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(int64);
	info.entrysize = sizeof(InFlight);
	/* a hard bound: a full table makes claims return fewer jobs */
	inflight = ShmemInitHash("pgjq_spike in-flight", max_in_flight, max_in_flight,
							 &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(LaneKey);
	info.entrysize = sizeof(Lane);
	lanes = ShmemInitHash("pgjq_spike lanes", max_lanes, max_lanes,
						  &info, HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
	LWLockRelease(AddinShmemInitLock);
}

/* ---------------------------------------------------------------------
 * lanes (every function here: the caller holds spike->lock)
 * --------------------------------------------------------------------- */

/* empty the node pool and the rings (the lanes hash is emptied by callers) */
static void
lanes_clear(void)
{
	for (int i = 0; i < lane_capacity; i++)
		spike->nodes[i].next = (i + 1 < lane_capacity) ? i + 1 : -1;
	spike->free_head = 0;
	spike->count = 0;
	spike->nrings = 0;
}

/* the ring of a priority; with create, made if missing (NULL when full) */
static PrioRing *
ring_for(int16 priority, bool create)
{
	int			i;

	for (i = 0; i < spike->nrings; i++)
	{
		if (spike->rings[i].priority == priority)
			return &spike->rings[i];
		if (spike->rings[i].priority > priority)
			break;
	}
	if (!create || spike->nrings >= MAX_PRIOS)
		return NULL;
	memmove(&spike->rings[i + 1], &spike->rings[i], sizeof(PrioRing) * (spike->nrings - i));
	spike->rings[i].priority = priority;
	spike->rings[i].head = NULL;
	spike->nrings++;
	return &spike->rings[i];
}

static void
lane_link(Lane *l)
{
	PrioRing   *r = ring_for(l->key.priority, false);

	if (r->head == NULL)
	{
		l->next = l->prev = l;
		r->head = l;
	}
	else
	{
		/* at the tail: the lane waits for its turn behind the others */
		Lane	   *h = r->head;

		l->next = h;
		l->prev = h->prev;
		h->prev->next = l;
		h->prev = l;
	}
	l->linked = true;
}

static void
lane_unlink(Lane *l)
{
	PrioRing   *r = ring_for(l->key.priority, false);

	if (l->next == l)
		r->head = NULL;
	else
	{
		l->prev->next = l->next;
		l->next->prev = l->prev;
		if (r->head == l)
			r->head = l->next;
	}
	l->next = l->prev = NULL;
	l->linked = false;
}

/*
 * After a lane's counts changed: linked exactly when it has jobs and its key
 * is under key_concurrency; dropped when nothing refers to it any more.
 */
static void
lane_settle(Lane *l)
{
	bool		want = l->count > 0 &&
		(key_concurrency <= 0 || l->running < key_concurrency);

	if (want && !l->linked)
		lane_link(l);
	else if (!want && l->linked)
		lane_unlink(l);
	if (!l->linked && l->count == 0 && l->running == 0 && l->pinned == 0)
		hash_search(lanes, &l->key, HASH_REMOVE, NULL);
}

/* the lane of a key, made if missing (NULL when max_lanes are in use) */
static Lane *
lane_get(const LaneKey *key)
{
	bool		found;
	Lane	   *l = hash_search(lanes, key, HASH_ENTER_NULL, &found);

	if (l != NULL && !found)
	{
		l->head = l->tail = -1;
		l->count = l->running = l->pinned = 0;
		l->linked = false;
		l->prev = l->next = NULL;
	}
	return l;
}

/* node room is reserved by the callers: these never fail */
static void
lane_push_back(Lane *l, const LaneEntry *e)
{
	int32		n = spike->free_head;

	spike->free_head = spike->nodes[n].next;
	spike->nodes[n].e = *e;
	spike->nodes[n].next = -1;
	if (l->tail >= 0)
		spike->nodes[l->tail].next = n;
	else
		l->head = n;
	l->tail = n;
	l->count++;
	spike->count++;
}

static void
lane_push_front(Lane *l, const LaneEntry *e)
{
	int32		n = spike->free_head;

	spike->free_head = spike->nodes[n].next;
	spike->nodes[n].e = *e;
	spike->nodes[n].next = l->head;
	l->head = n;
	if (l->tail < 0)
		l->tail = n;
	l->count++;
	spike->count++;
}

static void
lane_pop_front(Lane *l, LaneEntry *e)
{
	int32		n = l->head;

	*e = spike->nodes[n].e;
	l->head = spike->nodes[n].next;
	if (l->head < 0)
		l->tail = -1;
	spike->nodes[n].next = spike->free_head;
	spike->free_head = n;
	l->count--;
	spike->count--;
}

/* a lane key from a priority and a fair key (NULL: none) */
static void
lane_key(LaneKey *k, int16 priority, const char *fair_key)
{
	memset(k, 0, sizeof(LaneKey));
	k->priority = priority;
	if (fair_key != NULL)
	{
		if (strlen(fair_key) >= FAIR_KEY_LEN)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("fair_key must be shorter than %d bytes in the spike", FAIR_KEY_LEN)));
		strcpy(k->fair_key, fair_key);
	}
}

/* ---------------------------------------------------------------------
 * helpers
 * --------------------------------------------------------------------- */
static Oid
rel_oid(Oid nsp, const char *name)
{
	Oid			oid = get_relname_relid(name, nsp);

	if (!OidIsValid(oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"pgjq.%s\" of pgjq_spike does not exist", name)));
	return oid;
}

static void rebuild_state(double *ms, int64 *nready, int64 *ninflight, int64 *nrows);

/* the spike's relations in this database, looked up once per backend */
static void
lookup_oids(void)
{
	Oid			nsp = get_namespace_oid("pgjq", false);
	char		name[NAMEDATALEN];

	for (int i = 0; i < SPIKE_NSLOTS; i++)
	{
		snprintf(name, sizeof(name), "body_%d", i);
		body_oid[i] = rel_oid(nsp, name);
	}
	ledger_oid = rel_oid(nsp, "ledger");
	done_oid = rel_oid(nsp, "done");
	sched_oid = rel_oid(nsp, "sched");
	sched_idx_oid = rel_oid(nsp, "sched_run_at");
	jobseq_oid = rel_oid(nsp, "job_id_seq");
	tokseq_oid = rel_oid(nsp, "token_seq");
	cached_db = MyDatabaseId;
}

static void
check_ready(void)
{
	if (spike == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq_spike is not loaded"),
				 errhint("Add pgjq_spike to shared_preload_libraries and restart.")));
	if (cached_db != MyDatabaseId)
		lookup_oids();
	/*
	 * Unlocked read: ready only goes from false to true (rebuild, reset)
	 * while the server runs; a restart or crash starts from false.
	 */
	if (!spike->ready)
	{
		/*
		 * The first call after a start rebuilds; concurrent first calls wait
		 * for it on the lock and then find the state ready.  Nothing else
		 * takes ExclusiveLock on done, and no transaction writes to it while
		 * the state is not ready.
		 */
		LockRelationOid(done_oid, ExclusiveLock);
		if (!spike->ready)
			rebuild_state(NULL, NULL, NULL, NULL);
		UnlockRelationOid(done_oid, ExclusiveLock);
	}
	if (spike->dbid != MyDatabaseId)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq_spike state belongs to another database"),
				 errhint("The spike serves one database; call pgjq.spike_reset() in the one to use.")));
}

#define GROW(arr, n, max, type) \
	do { \
		if ((n) >= (max)) \
		{ \
			int newmax = (max) == 0 ? 64 : (max) * 2; \
			if ((arr) == NULL) \
				(arr) = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(type)); \
			else \
				(arr) = repalloc((arr), newmax * sizeof(type)); \
			(max) = newmax; \
		} \
	} while (0)

/* the priority and fair key of a body row (palloc'd key, NULL for none) */
static void
body_lane(HeapTuple tup, TupleDesc desc, int16 *prio, char **key)
{
	bool		isnull;
	Datum		d = heap_getattr(tup, BODY_PRIORITY, desc, &isnull);

	*prio = isnull ? 0 : DatumGetInt16(d);
	d = heap_getattr(tup, BODY_FAIRKEY, desc, &isnull);
	*key = isnull ? NULL : TextDatumGetCString(d);
}

/* room for m more entries in a pending list, before anything moves */
#define RESERVE(arr, n, max, type, m) \
	do { \
		while ((n) + (m) > (max)) \
		{ \
			int save = (n); \
			(n) = (max); \
			GROW(arr, n, max, type); \
			(n) = save; \
		} \
	} while (0)

/*
 * The slot a producer appends to.  Rotates to the next slot once the current
 * one holds slot_rows rows, if the next one is clean; otherwise keeps
 * appending (the real engine grows the ring instead).  Registers this
 * transaction as a writer of the slot, which keeps it from being truncated
 * until the transaction ends.
 */
static int
choose_slot(int n)
{
	int			s;

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	s = spike->cur_slot;
	if (spike->slots[s].appended >= slot_rows)
	{
		int			nx = (s + 1) % SPIKE_NSLOTS;

		if (spike->slots[nx].clean)
		{
			spike->slots[s].sealed = true;
			spike->slots[nx].clean = false;
			spike->cur_slot = nx;
			s = nx;
		}
		else
			spike->ring_full++;
	}
	spike->slots[s].appended += n;
	if (!my_writer[s])
	{
		spike->slots[s].writers++;
		my_writer[s] = true;
		any_writer = true;
	}
	LWLockRelease(spike->lock);
	return s;
}

/*
 * Truncate one sealed slot whose jobs are all finished, in the caller's
 * transaction (at most one per transaction).  Never waits for a lock: a
 * slot someone still reads (pg_dump, a straggling reader) is tried again
 * on a later call.
 */
static void
maybe_truncate(void)
{
	if (my_truncating >= 0)
		return;
	for (int s = 0; s < SPIKE_NSLOTS; s++)
	{
		SlotState  *st = &spike->slots[s];
		bool		mine = false;
		char		sql[64];

		/* unlocked hint first: this runs on every claim and outcome call */
		if (!st->sealed || st->truncating || st->open != 0 || st->writers != 0)
			continue;
		LWLockAcquire(spike->lock, LW_EXCLUSIVE);
		if (st->sealed && !st->truncating && st->open == 0 && st->writers == 0 &&
			s != spike->cur_slot)
		{
			st->truncating = true;
			mine = true;
		}
		LWLockRelease(spike->lock);
		if (!mine)
			continue;
		/* from here the abort callback resets st->truncating */
		my_truncating = s;
		my_truncating_level = GetCurrentTransactionNestLevel();
		if (!ConditionalLockRelationOid(body_oid[s], AccessExclusiveLock))
		{
			LWLockAcquire(spike->lock, LW_EXCLUSIVE);
			st->truncating = false;
			LWLockRelease(spike->lock);
			my_truncating = -1;
			continue;
		}
		/* TRUNCATE is rare (once per slot): SPI does the catalog work */
		snprintf(sql, sizeof(sql), "TRUNCATE pgjq.body_%d", s);
		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "SPI_connect failed");
		if (SPI_execute(sql, false, 0) != SPI_OK_UTILITY)
			elog(ERROR, "%s failed", sql);
		SPI_finish();
		return;
	}
}

/* one body row: a new job (after == NULL) or the next version of one */
static void
body_values(Datum *values, bool *nulls, int i, const int64 *ids, Datum *payloads,
			TimestampTz now, const TimestampTz *enq_at, const int64 *after,
			const int32 *attempt, const int16 *prio, char *const *keys)
{
	values[BODY_PRIORITY - 1] = Int16GetDatum(prio ? prio[i] : 0);
	nulls[BODY_PRIORITY - 1] = (prio == NULL || prio[i] == 0);
	values[BODY_FAIRKEY - 1] = (keys && keys[i]) ? CStringGetTextDatum(keys[i]) : (Datum) 0;
	nulls[BODY_FAIRKEY - 1] = !(keys && keys[i]);
	values[BODY_ID - 1] = Int64GetDatum(ids[i]);
	nulls[BODY_ID - 1] = false;
	values[BODY_AFTER - 1] = after ? Int64GetDatum(after[i]) : (Datum) 0;
	nulls[BODY_AFTER - 1] = (after == NULL || after[i] == 0);
	values[BODY_ENQUEUED - 1] = TimestampTzGetDatum(enq_at ? enq_at[i] : now);
	nulls[BODY_ENQUEUED - 1] = false;
	values[BODY_ATTEMPT - 1] = attempt ? Int32GetDatum(attempt[i]) : (Datum) 0;
	nulls[BODY_ATTEMPT - 1] = (attempt == NULL || attempt[i] == 1);
	values[BODY_PAYLOAD - 1] = payloads[i];
	nulls[BODY_PAYLOAD - 1] = false;
}

/*
 * Append bodies to the current slot: heap_insert for one, heap_multi_insert
 * for more, then the slot's indexes (the spike supports a btree on id only),
 * and remember the positions for the commit callback.  New jobs (after ==
 * NULL) draw their ids here; a re-append (fail, rescue) keeps the job's id,
 * enqueue time and payload and records the claim it closes in after_token
 * (0 = none).  With tids_out the rows are copies that are not published
 * (relocation): their positions go to tids_out, and the slot is returned.
 */
static int
body_append(int n, Datum *payloads, int64 *ids, const TimestampTz *enq_at,
			const int64 *after, const int32 *attempt, const int16 *prio,
			char *const *keys, ItemPointerData *tids_out)
{
	ItemPointerData *tids = tids_out ? tids_out : palloc(sizeof(ItemPointerData) * n);
	LaneKey    *lkeys = palloc(sizeof(LaneKey) * n);

	int			s = choose_slot(n);
	Relation	rel = table_open(body_oid[s], RowExclusiveLock);
	TupleDesc	desc = RelationGetDescr(rel);
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	CommandId	cid = GetCurrentCommandId(true);
	List	   *idxoids = RelationGetIndexList(rel);
	int			nidx = list_length(idxoids);
	Relation   *idx = palloc(sizeof(Relation) * Max(nidx, 1));
	IndexInfo **ii = palloc(sizeof(IndexInfo *) * Max(nidx, 1));
	ListCell   *lc;
	int			k = 0;
	int			level = GetCurrentTransactionNestLevel();

	foreach(lc, idxoids)
	{
		idx[k] = index_open(lfirst_oid(lc), RowExclusiveLock);
		ii[k] = BuildIndexInfo(idx[k]);
		if (ii[k]->ii_NumIndexAttrs != 1 || ii[k]->ii_IndexAttrNumbers[0] != 1 ||
			ii[k]->ii_Expressions != NIL || ii[k]->ii_Predicate != NIL)
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("pgjq_spike supports only an index on the id of a body table")));
		k++;
	}

	/* before anything is written: a fair key too long fails here */
	for (int i = 0; i < n; i++)
		lane_key(&lkeys[i], prio ? prio[i] : 0, keys ? keys[i] : NULL);

	if (after == NULL)
		for (int i = 0; i < n; i++)
			ids[i] = nextval_internal(jobseq_oid, false);

	if (n == 1)
	{
		Datum		values[BODY_NATTS];
		bool		nulls[BODY_NATTS];
		HeapTuple	tup;

		body_values(values, nulls, 0, ids, payloads, now, enq_at, after, attempt, prio, keys);
		tup = heap_form_tuple(desc, values, nulls);
		heap_insert(rel, tup, cid, 0, NULL);
		tids[0] = tup->t_self;
	}
	else
	{
		int			chunk = Min(n, SPIKE_MULTI_CHUNK);
		TupleTableSlot **slots = palloc(sizeof(TupleTableSlot *) * chunk);
		BulkInsertState bistate = GetBulkInsertState();

		for (int i = 0; i < chunk; i++)
			slots[i] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
		for (int done = 0; done < n; done += chunk)
		{
			int			m = Min(chunk, n - done);

			for (int i = 0; i < m; i++)
			{
				Datum		values[BODY_NATTS];
				bool		nulls[BODY_NATTS];

				body_values(values, nulls, done + i, ids, payloads, now, enq_at, after, attempt, prio, keys);
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

	for (int j = 0; j < nidx; j++)
	{
		for (int i = 0; i < n; i++)
		{
			Datum		v = Int64GetDatum(ids[i]);
			bool		isnull = false;

			index_insert(idx[j], &v, &isnull, &tids[i], rel,
						 UNIQUE_CHECK_NO, false, ii[j]);
		}
		index_close(idx[j], NoLock);
	}
	table_close(rel, NoLock);

	/* the positions the commit publishes */
	if (tids_out == NULL)
		for (int i = 0; i < n; i++)
		{
			GROW(p_enq, n_enq, max_enq, PendingEnq);
			p_enq[n_enq].e.id = ids[i];
			p_enq[n_enq].e.tid = tids[i];
			p_enq[n_enq].e.slot = s;
			p_enq[n_enq].level = level;
			p_enq[n_enq].key = lkeys[i];
			p_enq[n_enq].lane = NULL;
			n_enq++;
		}
	return s;
}

/* ---------------------------------------------------------------------
 * enqueue
 * --------------------------------------------------------------------- */
static int16
arg_priority(int32 p)
{
	if (p < PG_INT16_MIN || p > PG_INT16_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("priority must be between %d and %d", PG_INT16_MIN, PG_INT16_MAX)));
	return (int16) p;
}

/* columns of pgjq.sched */
#define SCHED_RUN_AT 1
#define SCHED_NATTS 8

/*
 * A delayed job goes to pgjq.sched (a plain table with a btree on run_at),
 * not to the ring: a job due in 30 days must not pin a ring slot.  The
 * promoter moves due rows into the ring (DELETE there, append here) in one
 * transaction; dead tuples are thus only on the delayed path, for vacuum.
 */
static int64
sched_insert(TimestampTz run_at, Datum payload, int16 prio, const char *key)
{
	Relation	rel = table_open(sched_oid, RowExclusiveLock);
	Relation	idx = index_open(sched_idx_oid, RowExclusiveLock);
	IndexInfo  *ii = BuildIndexInfo(idx);
	Datum		values[SCHED_NATTS];
	bool		nulls[SCHED_NATTS] = {0};
	HeapTuple	tup;
	int64		id;
	LaneKey		k;
	Datum		iv = TimestampTzGetDatum(run_at);
	bool		inull = false;

	lane_key(&k, prio, key);	/* a fair key too long fails before writing */
	id = nextval_internal(jobseq_oid, false);
	values[0] = TimestampTzGetDatum(run_at);
	values[1] = Int64GetDatum(id);
	nulls[2] = true;			/* after_token */
	values[3] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
	nulls[4] = true;			/* attempt 1 */
	values[5] = Int16GetDatum(prio);
	nulls[5] = (prio == 0);
	values[6] = key ? CStringGetTextDatum(key) : (Datum) 0;
	nulls[6] = (key == NULL);
	values[7] = payload;
	tup = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	heap_insert(rel, tup, GetCurrentCommandId(true), 0, NULL);
	index_insert(idx, &iv, &inull, &tup->t_self, rel, UNIQUE_CHECK_NO, false, ii);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	if (!my_due || run_at < my_due_min)
		my_due_min = run_at;
	my_due = true;
	return id;
}

/* the first run_at of pgjq.sched matching (strategy, bound), or DT_NOEND */
static TimestampTz
sched_first(Relation rel, Relation idx, Snapshot snap, StrategyNumber strategy, RegProcedure proc,
			TimestampTz bound)
{
	ScanKeyData key;
	IndexScanDesc scan;
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TimestampTz r = DT_NOEND;
	bool		isnull;

	ScanKeyInit(&key, 1, strategy, proc, TimestampTzGetDatum(bound));
	scan = index_beginscan(rel, idx, snap, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
		r = DatumGetTimestampTz(slot_getattr(slot, SCHED_RUN_AT, &isnull));
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return r;
}

/*
 * promote(max_jobs, wait): the background worker's promotion pass.  Sleeps
 * until the earliest scheduled job is due (a producer's commit that
 * schedules an earlier one wakes it) or wait has passed, then moves up to
 * max_jobs due jobs into the ring, oldest run_at first.  One promoter at a
 * time.  Returns how many.
 */
PG_FUNCTION_INFO_V1(spike_promote);
Datum
spike_promote(PG_FUNCTION_ARGS)
{
	int			max_jobs;
	TimestampTz until;
	TimestampTz now;
	Relation	rel,
				idx;
	Snapshot	snap;
	ScanKeyData key;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	int			n = 0;
	int64	   *ids;
	int64	   *after;
	TimestampTz *enq;
	int32	   *attempt;
	int16	   *prio;
	char	  **keys;
	Datum	   *payloads;
	ItemPointerData *tids;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_jobs and wait must not be NULL")));
	max_jobs = PG_GETARG_INT32(0);
	if (max_jobs < 1 || max_jobs > 100000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_jobs must be between 1 and 100000")));
	until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
													TimestampTzGetDatum(GetCurrentTimestamp()),
													PG_GETARG_DATUM(1)));
	check_ready();
	if (my_promoting)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq.promote() runs once per transaction")));

	/*
	 * one promoter at a time: a lock on an object tag of pgjq.sched, not on
	 * the relation, which autovacuum takes and a promoter would wait for
	 */
	LockDatabaseObject(RelationRelationId, sched_oid, 1, ExclusiveLock);
	ids = palloc(sizeof(int64) * max_jobs);
	after = palloc(sizeof(int64) * max_jobs);
	enq = palloc(sizeof(TimestampTz) * max_jobs);
	attempt = palloc(sizeof(int32) * max_jobs);
	prio = palloc(sizeof(int16) * max_jobs);
	keys = palloc(sizeof(char *) * max_jobs);
	payloads = palloc(sizeof(Datum) * max_jobs);
	tids = palloc(sizeof(ItemPointerData) * max_jobs);
	rel = table_open(sched_oid, RowExclusiveLock);
	idx = index_open(sched_idx_oid, AccessShareLock);
	for (;;)
	{
		/* sleep until the earliest job is due, or the wait is over */
		ConditionVariablePrepareToSleep(&spike->due);
		for (;;)
		{
			TimestampTz nd = spike->next_due;	/* unlocked: a hint */

			now = GetCurrentTimestamp();
			if (nd <= now)
				break;
			if (until <= now)
			{
				ConditionVariableCancelSleep();
				index_close(idx, NoLock);
				table_close(rel, NoLock);
				PG_RETURN_INT64(0);
			}
			(void) ConditionVariableTimedSleep(&spike->due,
											   (long) ((Min(nd, until) - now + 999) / 1000),
											   PG_WAIT_EXTENSION);
		}
		ConditionVariableCancelSleep();

		/* the generation first, the snapshot after: see the commit callback */
		LWLockAcquire(spike->lock, LW_SHARED);
		my_due_gen = spike->due_gen;
		LWLockRelease(spike->lock);
		snap = RegisterSnapshot(GetLatestSnapshot());
		now = GetCurrentTimestamp();
		slot = table_slot_create(rel, NULL);
		ScanKeyInit(&key, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE, TimestampTzGetDatum(now));
		scan = index_beginscan(rel, idx, snap, 1, 0);
		index_rescan(scan, &key, 1, NULL, 0);
		while (n < max_jobs && index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			bool		isnull;
			Datum		d;

			slot_getallattrs(slot);
			ids[n] = DatumGetInt64(slot_getattr(slot, 2, &isnull));
			d = slot_getattr(slot, 3, &isnull);
			after[n] = isnull ? 0 : DatumGetInt64(d);
			enq[n] = DatumGetTimestampTz(slot_getattr(slot, 4, &isnull));
			d = slot_getattr(slot, 5, &isnull);
			attempt[n] = isnull ? 1 : DatumGetInt32(d);
			d = slot_getattr(slot, 6, &isnull);
			prio[n] = isnull ? 0 : DatumGetInt16(d);
			d = slot_getattr(slot, 7, &isnull);
			keys[n] = isnull ? NULL : TextDatumGetCString(d);
			payloads[n] = PointerGetDatum(PG_DETOAST_DATUM_COPY(slot_getattr(slot, 8, &isnull)));
			tids[n] = slot->tts_tid;
			n++;
		}
		/* what comes due next: more due now, or the first later one */
		if (n == max_jobs && index_getnext_slot(scan, ForwardScanDirection, slot))
			my_next_due = 0;
		else
			my_next_due = sched_first(rel, idx, snap, BTGreaterStrategyNumber, F_TIMESTAMPTZ_GT, now);
		index_endscan(scan);
		ExecDropSingleTupleTableSlot(slot);
		UnregisterSnapshot(snap);
		if (n > 0)
			break;

		/*
		 * nothing due (next_due was unknown, or the job went): an empty pass
		 * changes nothing, so what comes next can be told now
		 */
		LWLockAcquire(spike->lock, LW_EXCLUSIVE);
		if (spike->due_gen == my_due_gen || my_next_due < spike->next_due)
			spike->next_due = my_next_due;
		LWLockRelease(spike->lock);
		if (until <= GetCurrentTimestamp())
		{
			index_close(idx, NoLock);
			table_close(rel, NoLock);
			PG_RETURN_INT64(0);
		}
	}
	for (int i = 0; i < n; i++)
		simple_heap_delete(rel, &tids[i]);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	if (n > 0)
		body_append(n, payloads, ids, enq, after, attempt, prio, keys, NULL);
	my_promoting = true;
	my_promoted = n;
	PG_RETURN_INT64(n);
}

PG_FUNCTION_INFO_V1(spike_enqueue);
Datum
spike_enqueue(PG_FUNCTION_ARGS)
{
	Datum		payload;
	int64		id;
	int16		prio;
	char	   *key;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload and priority must not be NULL")));
	payload = PointerGetDatum(PG_GETARG_JSONB_P(1));
	prio = arg_priority(PG_GETARG_INT32(2));
	key = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	check_ready();
	if (!PG_ARGISNULL(4) && PG_GETARG_TIMESTAMPTZ(4) > GetCurrentTimestamp())
		PG_RETURN_INT64(sched_insert(PG_GETARG_TIMESTAMPTZ(4), payload, prio, key));
	body_append(1, &payload, &id, NULL, NULL, NULL, &prio, &key, NULL);
	PG_RETURN_INT64(id);
}

PG_FUNCTION_INFO_V1(spike_enqueue_many);
Datum
spike_enqueue_many(PG_FUNCTION_ARGS)
{
	ArrayType  *arr;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int64	   *ids;
	int16	   *prio;
	char	  **keys;
	int16		p;
	char	   *key;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payloads and priority must not be NULL")));
	arr = PG_GETARG_ARRAYTYPE_P(1);
	p = arg_priority(PG_GETARG_INT32(2));
	key = PG_ARGISNULL(3) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(3));
	check_ready();
	/* a scalar SETOF: the expected descriptor has the one column */
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	deconstruct_array(arr, JSONBOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("payloads must not contain NULL")));
	if (n == 0)
		return (Datum) 0;
	ids = palloc(sizeof(int64) * n);
	prio = palloc(sizeof(int16) * n);
	keys = palloc(sizeof(char *) * n);
	for (int i = 0; i < n; i++)
	{
		prio[i] = p;
		keys[i] = key;
	}
	body_append(n, elems, ids, NULL, NULL, NULL, prio, keys, NULL);
	for (int i = 0; i < n; i++)
	{
		Datum		v = Int64GetDatum(ids[i]);
		bool		isnull = false;

		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &v, &isnull);
	}
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * claim
 * --------------------------------------------------------------------- */

/*
 * Pop up to n positions from the lane into the in-flight table (CLAIMING),
 * write one ledger row, and put the claimed jobs (payload read by TID from
 * the ring, without an MVCC test: a published position proves its producer
 * committed) into the caller's tuplestore.
 */
static int
do_claim(FunctionCallInfo fcinfo, int batch, Interval *lease)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	LaneEntry  *got;
	int			k = 0;
	int64		token;
	TimestampTz lease_until;
	TransactionId xid;
	int			level = GetCurrentTransactionNestLevel();
	Relation	rels[SPIKE_NSLOTS] = {NULL};

	if (batch < 1 || batch > 10000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch must be between 1 and 10000")));
	/* unlocked hint: an empty poll writes nothing and draws no token */
	if (spike->count == 0)
		return 0;

	xid = GetTopTransactionId();
	token = nextval_internal(tokseq_oid, false);
	lease_until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														  TimestampTzGetDatum(GetCurrentTimestamp()),
														  IntervalPGetDatum(lease)));
	got = palloc(sizeof(LaneEntry) * batch);
	/* room for the local record before anything moves (no failure after) */
	RESERVE(p_claim, n_claim, max_claim, PendingId, batch);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	while (k < batch)
	{
		PrioRing   *r = NULL;
		Lane	   *l;
		LaneEntry	e;
		bool		found;
		InFlight   *f;

		/* the most urgent priority with a lane that may run */
		for (int i = 0; i < spike->nrings && r == NULL; i++)
			if (spike->rings[i].head != NULL)
				r = &spike->rings[i];
		if (r == NULL)
			break;
		l = r->head;
		e = spike->nodes[l->head].e;
		f = hash_search(inflight, &e.id, HASH_ENTER_NULL, &found);
		if (f == NULL)
			break;				/* in-flight table full: claim fewer */
		Assert(!found);
		lane_pop_front(l, &e);
		l->running++;
		/* its turn is over: the next lane, and this one parked or dropped if due */
		r->head = l->next;
		lane_settle(l);
		f->lane = l;
		f->token = token;
		f->lease_until = lease_until;
		f->xid = xid;
		f->tid = e.tid;
		f->slot = e.slot;
		f->state = IF_CLAIMING;
		got[k++] = e;
		p_claim[n_claim].id = e.id;
		p_claim[n_claim].level = level;
		p_claim[n_claim].was_claiming = false;
		n_claim++;
	}
	spike->held += k;
	spike->claimed += k;
	LWLockRelease(spike->lock);

	if (k == 0)
		return 0;

	/* the claim's one durable record */
	{
		Relation	lrel = table_open(ledger_oid, RowExclusiveLock);
		Datum	   *idd = palloc(sizeof(Datum) * k);
		Datum		values[4];
		bool		nulls[4] = {false, false, true, false};

		for (int i = 0; i < k; i++)
			idd[i] = Int64GetDatum(got[i].id);
		values[0] = Int64GetDatum(token);
		values[1] = TimestampTzGetDatum(lease_until);
		values[2] = (Datum) 0;
		values[3] = PointerGetDatum(construct_array(idd, k, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		simple_heap_insert(lrel, heap_form_tuple(RelationGetDescr(lrel), values, nulls));
		table_close(lrel, NoLock);
	}

	for (int i = 0; i < k; i++)
	{
		Relation	rel;
		HeapTupleData tup;
		Buffer		buf;
		bool		isnull;
		Datum		values[6];
		bool		nulls[6] = {false, false, false, false, false, false};

		if (rels[got[i].slot] == NULL)
			rels[got[i].slot] = table_open(body_oid[got[i].slot], AccessShareLock);
		rel = rels[got[i].slot];
		tup.t_self = got[i].tid;
		if (!heap_fetch(rel, SnapshotAny, &tup, &buf, false))
			elog(ERROR, "pgjq_spike: body of job " INT64_FORMAT " not found", got[i].id);
		if (DatumGetInt64(heap_getattr(&tup, BODY_ID, RelationGetDescr(rel), &isnull)) != got[i].id)
			elog(ERROR, "pgjq_spike: body at the position of job " INT64_FORMAT " is another job",
				 got[i].id);
		values[0] = Int64GetDatum(got[i].id);
		values[1] = Int64GetDatum(token);
		values[2] = heap_getattr(&tup, BODY_ATTEMPT, RelationGetDescr(rel), &isnull);
		if (isnull)
			values[2] = Int32GetDatum(1);
		values[3] = PointerGetDatum(PG_DETOAST_DATUM_COPY(heap_getattr(&tup, BODY_PAYLOAD, RelationGetDescr(rel), &isnull)));
		values[4] = heap_getattr(&tup, BODY_ENQUEUED, RelationGetDescr(rel), &isnull);
		values[5] = TimestampTzGetDatum(lease_until);
		ReleaseBuffer(buf);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	for (int s = 0; s < SPIKE_NSLOTS; s++)
		if (rels[s])
			table_close(rels[s], NoLock);
	return k;
}

/* unlocked: is there a lane a claim would take from? */
static bool
claimable(void)
{
	for (int i = 0; i < spike->nrings; i++)
		if (spike->rings[i].head != NULL)
			return true;
	return false;
}

PG_FUNCTION_INFO_V1(spike_claim);
Datum
spike_claim(PG_FUNCTION_ARGS)
{
	int			batch;
	Interval   *lease;
	TimestampTz until = 0;

	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("batch and lease must not be NULL")));
	batch = PG_GETARG_INT32(1);
	lease = PG_GETARG_INTERVAL_P(2);
	if (!PG_ARGISNULL(3))
		until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														TimestampTzGetDatum(GetCurrentTimestamp()),
														PG_GETARG_DATUM(3)));
	check_ready();
	InitMaterializedSRF(fcinfo, 0);
	maybe_truncate();
	if (do_claim(fcinfo, batch, lease) > 0 || until == 0)
		return (Datum) 0;

	/*
	 * wait: sleep until a commit publishes jobs (or a closure unparks a
	 * key), then claim; prepare before looking, so no broadcast is missed
	 */
	ConditionVariablePrepareToSleep(&spike->wake);
	for (;;)
	{
		long		ms;

		if (claimable() && do_claim(fcinfo, batch, lease) > 0)
			break;
		ms = (long) ((until - GetCurrentTimestamp()) / 1000);
		if (ms <= 0)
			break;
		(void) ConditionVariableTimedSleep(&spike->wake, ms, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return (Datum) 0;
}

/* ---------------------------------------------------------------------
 * outcomes
 * --------------------------------------------------------------------- */

/* is a heartbeat of this transaction (level < from) pending for id? */
static bool
ext_pending(int64 id, int from)
{
	for (int i = 0; i < n_ext; i++)
		if (p_ext[i].id == id && p_ext[i].level < from)
			return true;
	return false;
}

/*
 * Write the outcome row of closed jobs and, for a failure or a rescue, append
 * each job's next version (same id, enqueue time and payload, attempt + 1,
 * after_token = the closed claim), published when this transaction commits.
 */
static void
close_found(int nok, const int64 *okid, const int64 *oktok, const ItemPointerData *oktid,
			const uint16 *okslot, char kind)
{
	Relation	drel = table_open(done_oid, RowExclusiveLock);
	Datum	   *idd = palloc(sizeof(Datum) * nok);
	Datum	   *tokd = palloc(sizeof(Datum) * nok);
	int			ntok = 1;
	Datum		values[4];
	bool		nulls[4] = {false, kind == 0, false, false};

	for (int i = 0; i < nok; i++)
	{
		idd[i] = Int64GetDatum(okid[i]);
		tokd[i] = Int64GetDatum(oktok[i]);
		if (oktok[i] != oktok[0])
			ntok = nok;
	}
	values[0] = TimestampTzGetDatum(GetCurrentTimestamp());
	values[1] = CharGetDatum(kind);
	values[2] = PointerGetDatum(construct_array(tokd, ntok, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[3] = PointerGetDatum(construct_array(idd, nok, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	simple_heap_insert(drel, heap_form_tuple(RelationGetDescr(drel), values, nulls));
	table_close(drel, NoLock);

	if (kind != 0)
	{
		Datum	   *payloads = palloc(sizeof(Datum) * nok);
		TimestampTz *enq = palloc(sizeof(TimestampTz) * nok);
		int32	   *attempt = palloc(sizeof(int32) * nok);
		int64	   *ids = palloc(sizeof(int64) * nok);
		int16	   *prio = palloc(sizeof(int16) * nok);
		char	  **keys = palloc(sizeof(char *) * nok);
		Relation	rels[SPIKE_NSLOTS] = {NULL};

		for (int i = 0; i < nok; i++)
		{
			HeapTupleData tup;
			Buffer		buf;
			bool		isnull;
			Relation	rel;
			TupleDesc	desc;

			if (rels[okslot[i]] == NULL)
				rels[okslot[i]] = table_open(body_oid[okslot[i]], AccessShareLock);
			rel = rels[okslot[i]];
			desc = RelationGetDescr(rel);
			tup.t_self = oktid[i];
			if (!heap_fetch(rel, SnapshotAny, &tup, &buf, false))
				elog(ERROR, "pgjq_spike: body of job " INT64_FORMAT " not found", okid[i]);
			ids[i] = okid[i];
			payloads[i] = PointerGetDatum(PG_DETOAST_DATUM_COPY(heap_getattr(&tup, BODY_PAYLOAD, desc, &isnull)));
			enq[i] = DatumGetTimestampTz(heap_getattr(&tup, BODY_ENQUEUED, desc, &isnull));
			attempt[i] = DatumGetInt32(heap_getattr(&tup, BODY_ATTEMPT, desc, &isnull));
			if (isnull)
				attempt[i] = 1;
			attempt[i]++;
			body_lane(&tup, desc, &prio[i], &keys[i]);
			ReleaseBuffer(buf);
		}
		for (int s = 0; s < SPIKE_NSLOTS; s++)
			if (rels[s])
				table_close(rels[s], NoLock);
		body_append(nok, payloads, ids, enq, oktok, attempt, prio, keys, NULL);
		if (kind == 'f')
			my_failed += nok;
		else
			my_rescued += nok;
	}
}

/*
 * Mark the (id, token) pairs that are OPEN (or that this transaction
 * heartbeats) as CLOSING by this transaction and write one outcome row of
 * the kind (0 completed, 'f' failed).  A missing id, a wrong token, a claim
 * not committed yet: stale, nothing changes.  An entry another transaction
 * is closing or extending: wait for it to end (the row-lock analogue), then
 * look again.
 */
static int64
do_close(int n, const int64 *ids, const int64 *toks, char kind)
{
	TransactionId xid;
	int			level = GetCurrentTransactionNestLevel();
	int64	   *okid;
	int64	   *oktok;
	ItemPointerData *oktid;
	uint16	   *okslot;
	int			nok = 0;
	int			nstale = 0;

	if (n == 0)
		return 0;
	xid = GetTopTransactionId();
	okid = palloc(sizeof(int64) * n);
	oktok = palloc(sizeof(int64) * n);
	oktid = palloc(sizeof(ItemPointerData) * n);
	okslot = palloc(sizeof(uint16) * n);
	RESERVE(p_close, n_close, max_close, PendingId, n);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		InFlight   *f;

		for (;;)
		{
			TransactionId other;

			f = hash_search(inflight, &ids[i], HASH_FIND, NULL);
			if (f == NULL || f->token != toks[i] ||
				(f->state != IF_CLOSING && f->state != IF_EXTENDING) || f->xid == xid)
				break;
			other = f->xid;
			LWLockRelease(spike->lock);
			XactLockTableWait(other, NULL, NULL, XLTW_None);
			LWLockAcquire(spike->lock, LW_EXCLUSIVE);
		}
		/*
		 * OPEN, or extended or claimed by this very transaction: a claim and
		 * its outcome may share a transaction (they commit or abort together)
		 */
		if (f == NULL || f->token != toks[i] ||
			!(f->state == IF_OPEN ||
			  ((f->state == IF_EXTENDING || f->state == IF_CLAIMING) && f->xid == xid)))
		{
			nstale++;
			continue;
		}
		p_close[n_close].was_claiming = (f->state == IF_CLAIMING);
		f->state = IF_CLOSING;
		f->xid = xid;
		okid[nok] = ids[i];
		oktok[nok] = toks[i];
		oktid[nok] = f->tid;
		okslot[nok] = f->slot;
		nok++;
		p_close[n_close].id = ids[i];
		p_close[n_close].level = level;
		n_close++;
	}
	spike->stale += nstale;
	LWLockRelease(spike->lock);

	if (nok > 0)
		close_found(nok, okid, oktok, oktid, okslot, kind);
	return nok;
}

static int
int8_array(ArrayType *arr, int64 **out)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and tokens must be one-dimensional")));
	deconstruct_array(arr, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, &nulls, &n);
	*out = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("ids and tokens must not contain NULL")));
		(*out)[i] = DatumGetInt64(elems[i]);
	}
	return n;
}

static int64
complete_arrays(ArrayType *a_ids, ArrayType *a_toks)
{
	int64	   *ids,
			   *toks;
	int			n = int8_array(a_ids, &ids);

	if (int8_array(a_toks, &toks) != n)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids and tokens must have the same length")));
	return do_close(n, ids, toks, 0);
}

PG_FUNCTION_INFO_V1(spike_complete_one);
Datum
spike_complete_one(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	int64		tok = PG_GETARG_INT64(1);

	check_ready();
	maybe_truncate();
	PG_RETURN_BOOL(do_close(1, &id, &tok, 0) == 1);
}

PG_FUNCTION_INFO_V1(spike_complete);
Datum
spike_complete(PG_FUNCTION_ARGS)
{
	check_ready();
	maybe_truncate();
	PG_RETURN_INT64(complete_arrays(PG_GETARG_ARRAYTYPE_P(0), PG_GETARG_ARRAYTYPE_P(1)));
}

/*
 * complete what the caller holds, then claim the next batch: one statement,
 * one transaction.  A stale token shows only as fewer completions, which
 * this spike does not report (the real call needs an output for it).
 */
PG_FUNCTION_INFO_V1(spike_complete_and_claim);
Datum
spike_complete_and_claim(PG_FUNCTION_ARGS)
{
	check_ready();
	InitMaterializedSRF(fcinfo, 0);
	maybe_truncate();
	(void) complete_arrays(PG_GETARG_ARRAYTYPE_P(1), PG_GETARG_ARRAYTYPE_P(2));
	do_claim(fcinfo, PG_GETARG_INT32(3), PG_GETARG_INTERVAL_P(4));
	return (Datum) 0;
}

/*
 * fail(id, token, error): close the claim and append the job again, ready at
 * once with attempt + 1 (the spike has no backoff and no dead jobs; error is
 * not kept).  False when the token is stale.
 */
PG_FUNCTION_INFO_V1(spike_fail);
Datum
spike_fail(PG_FUNCTION_ARGS)
{
	int64		id,
				tok;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id and token must not be NULL")));
	id = PG_GETARG_INT64(0);
	tok = PG_GETARG_INT64(1);
	check_ready();
	maybe_truncate();
	PG_RETURN_BOOL(do_close(1, &id, &tok, 'f') == 1);
}

/*
 * heartbeat(id, token, extend): the lease moves to now + extend when this
 * transaction commits, and a ledger row (kind 'h') makes it durable.  While
 * the heartbeat is uncommitted the entry is EXTENDING: a rescue skips it, an
 * outcome of another transaction waits for it.  NULL when the token is stale.
 */
PG_FUNCTION_INFO_V1(spike_heartbeat);
Datum
spike_heartbeat(PG_FUNCTION_ARGS)
{
	int64		id = PG_GETARG_INT64(0);
	int64		tok = PG_GETARG_INT64(1);
	Interval   *extend = PG_GETARG_INTERVAL_P(2);
	TransactionId xid;
	TimestampTz lease_until;
	InFlight   *f;

	check_ready();
	xid = GetTopTransactionId();
	lease_until = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_pl_interval,
														  TimestampTzGetDatum(GetCurrentTimestamp()),
														  IntervalPGetDatum(extend)));
	RESERVE(p_ext, n_ext, max_ext, PendingExt, 1);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	for (;;)
	{
		TransactionId other;

		f = hash_search(inflight, &id, HASH_FIND, NULL);
		if (f == NULL || f->token != tok ||
			(f->state != IF_CLOSING && f->state != IF_EXTENDING) || f->xid == xid)
			break;
		other = f->xid;
		LWLockRelease(spike->lock);
		XactLockTableWait(other, NULL, NULL, XLTW_None);
		LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	}
	if (f == NULL || f->token != tok ||
		!(f->state == IF_OPEN || (f->state == IF_EXTENDING && f->xid == xid)))
	{
		spike->stale++;
		LWLockRelease(spike->lock);
		PG_RETURN_NULL();
	}
	f->state = IF_EXTENDING;
	f->xid = xid;
	p_ext[n_ext].id = id;
	p_ext[n_ext].lease_until = lease_until;
	p_ext[n_ext].level = GetCurrentTransactionNestLevel();
	n_ext++;
	LWLockRelease(spike->lock);

	{
		Relation	lrel = table_open(ledger_oid, RowExclusiveLock);
		Datum		idd = Int64GetDatum(id);
		Datum		values[4];
		bool		nulls[4] = {false, false, false, false};

		values[0] = Int64GetDatum(tok);
		values[1] = TimestampTzGetDatum(lease_until);
		values[2] = CharGetDatum('h');
		values[3] = PointerGetDatum(construct_array(&idd, 1, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		simple_heap_insert(lrel, heap_form_tuple(RelationGetDescr(lrel), values, nulls));
		table_close(lrel, NoLock);
	}
	PG_RETURN_TIMESTAMPTZ(lease_until);
}

/*
 * Relocate the stragglers of the slot the ring needs next: when it is sealed
 * and few of its jobs are unfinished (at most pgjq_spike.relocate_max), all
 * of them in flight, copy their bodies (same id, version, payload) into the
 * current slot; at commit the in-flight entries point to the copies and the
 * old slot's open count drops, so it can be truncated.  A job leased for
 * hours then costs one copy per ring cycle instead of a whole slot.  The
 * copies need no durable marker: a copy and its original are the same
 * version, so the rebuild may take either, and it counts only the one it
 * takes.  An entry closed before the commit keeps its old slot (its copy is
 * then a finished job's row, truncated with its slot).
 */
static int64
relocate_stragglers(void)
{
	int			nx;
	int64		n = 0,
				inslot = 0;
	HASH_SEQ_STATUS hs;
	InFlight   *f;
	int64	   *ids;
	int64	   *toks;
	ItemPointerData *old;
	SlotState  *st;
	int			level = GetCurrentTransactionNestLevel();

	nx = (spike->cur_slot + 1) % SPIKE_NSLOTS;
	st = &spike->slots[nx];
	/* unlocked hint: this runs on every rescue call */
	if (!st->sealed || st->clean || st->truncating || st->writers != 0 ||
		st->open <= 0 || st->open > relocate_max || my_truncating >= 0)
		return 0;
	ids = palloc(sizeof(int64) * relocate_max);
	toks = palloc(sizeof(int64) * relocate_max);
	old = palloc(sizeof(ItemPointerData) * relocate_max);
	RESERVE(p_reloc, n_reloc, max_reloc, PendingReloc, relocate_max);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	nx = (spike->cur_slot + 1) % SPIKE_NSLOTS;
	st = &spike->slots[nx];
	if (st->sealed && !st->clean && !st->truncating && st->writers == 0 &&
		st->open > 0 && st->open <= relocate_max)
	{
		hash_seq_init(&hs, inflight);
		while ((f = hash_seq_search(&hs)) != NULL)
		{
			if (f->slot != nx)
				continue;
			inslot++;
			if (f->state == IF_OPEN && n < relocate_max)
			{
				ids[n] = f->id;
				toks[n] = f->token;
				old[n] = f->tid;
				n++;
			}
		}
		/* some of its jobs still wait in the lane: they go first anyway */
		if (inslot != st->open)
			n = 0;
	}
	LWLockRelease(spike->lock);
	if (n == 0)
		return 0;

	{
		Relation	rel = table_open(body_oid[nx], AccessShareLock);
		TupleDesc	desc = RelationGetDescr(rel);
		Datum	   *payloads = palloc(sizeof(Datum) * n);
		TimestampTz *enq = palloc(sizeof(TimestampTz) * n);
		int64	   *after = palloc(sizeof(int64) * n);
		int32	   *attempt = palloc(sizeof(int32) * n);
		int16	   *prio = palloc(sizeof(int16) * n);
		char	  **keys = palloc(sizeof(char *) * n);
		ItemPointerData *tids = palloc(sizeof(ItemPointerData) * n);
		int			slot;

		for (int64 i = 0; i < n; i++)
		{
			HeapTupleData tup;
			Buffer		buf;
			bool		isnull;

			tup.t_self = old[i];
			if (!heap_fetch(rel, SnapshotAny, &tup, &buf, false))
				elog(ERROR, "pgjq_spike: body of job " INT64_FORMAT " not found", ids[i]);
			payloads[i] = PointerGetDatum(PG_DETOAST_DATUM_COPY(heap_getattr(&tup, BODY_PAYLOAD, desc, &isnull)));
			enq[i] = DatumGetTimestampTz(heap_getattr(&tup, BODY_ENQUEUED, desc, &isnull));
			after[i] = DatumGetInt64(heap_getattr(&tup, BODY_AFTER, desc, &isnull));
			if (isnull)
				after[i] = 0;
			attempt[i] = DatumGetInt32(heap_getattr(&tup, BODY_ATTEMPT, desc, &isnull));
			if (isnull)
				attempt[i] = 1;
			body_lane(&tup, desc, &prio[i], &keys[i]);
			ReleaseBuffer(buf);
		}
		table_close(rel, NoLock);
		slot = body_append(n, payloads, ids, enq, after, attempt, prio, keys, tids);
		for (int64 i = 0; i < n; i++)
		{
			p_reloc[n_reloc].id = ids[i];
			p_reloc[n_reloc].token = toks[i];
			p_reloc[n_reloc].tid = tids[i];
			p_reloc[n_reloc].old_slot = nx;
			p_reloc[n_reloc].slot = slot;
			p_reloc[n_reloc].level = level;
			n_reloc++;
		}
	}
	return n;
}

/*
 * rescue(max_jobs): close up to max_jobs claims whose lease has expired and
 * append their jobs again (attempt + 1), as the background worker would.
 * Entries being closed or extended by another transaction are skipped.
 */
PG_FUNCTION_INFO_V1(spike_rescue);
Datum
spike_rescue(PG_FUNCTION_ARGS)
{
	int			max_jobs = PG_GETARG_INT32(0);
	TimestampTz now = GetCurrentTimestamp();
	TransactionId xid;
	HASH_SEQ_STATUS hs;
	InFlight   *f;
	int64	   *okid;
	int64	   *oktok;
	ItemPointerData *oktid;
	uint16	   *okslot;
	int			nok = 0;
	int			level = GetCurrentTransactionNestLevel();

	if (max_jobs < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_jobs must be at least 1")));
	check_ready();
	if (hash_get_num_entries(inflight) == 0)
		PG_RETURN_INT64(0);
	xid = GetTopTransactionId();
	RESERVE(p_reloc, n_reloc, max_reloc, PendingReloc, relocate_max);
	okid = palloc(sizeof(int64) * max_jobs);
	oktok = palloc(sizeof(int64) * max_jobs);
	oktid = palloc(sizeof(ItemPointerData) * max_jobs);
	okslot = palloc(sizeof(uint16) * max_jobs);
	RESERVE(p_close, n_close, max_close, PendingId, max_jobs);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	hash_seq_init(&hs, inflight);
	while ((f = hash_seq_search(&hs)) != NULL)
	{
		if (f->state != IF_OPEN || f->lease_until >= now)
			continue;
		f->state = IF_CLOSING;
		f->xid = xid;
		okid[nok] = f->id;
		oktok[nok] = f->token;
		oktid[nok] = f->tid;
		okslot[nok] = f->slot;
		p_close[n_close].id = f->id;
		p_close[n_close].level = level;
		p_close[n_close].was_claiming = false;
		n_close++;
		if (++nok >= max_jobs)
		{
			hash_seq_term(&hs);
			break;
		}
	}
	LWLockRelease(spike->lock);
	if (nok > 0)
		close_found(nok, okid, oktok, oktid, okslot, 'r');
	(void) relocate_stragglers();
	PG_RETURN_INT64(nok);
}

/* ---------------------------------------------------------------------
 * transaction callbacks: publish, apply, undo
 * --------------------------------------------------------------------- */
static void
reset_local(void)
{
	n_enq = n_claim = n_close = n_ext = n_reloc = 0;
	my_failed = my_rescued = 0;
	my_due = my_promoting = false;
	my_promoted = 0;
	if (any_writer)
		memset(my_writer, 0, sizeof(my_writer));
	any_writer = false;
	my_reserved = 0;
	my_truncating = -1;
}

/* give back claims with level >= from (all when from = 0); lock held */
static void
undo_claims(int from)
{
	int			keep = 0;

	/* newest first, so the lane gets them back in their old order */
	for (int i = n_claim - 1; i >= 0; i--)
	{
		InFlight   *f;
		LaneEntry	e;

		if (p_claim[i].level < from)
			continue;
		f = hash_search(inflight, &p_claim[i].id, HASH_FIND, NULL);
		if (f == NULL || f->state != IF_CLAIMING)
			continue;			/* cannot happen; never fail here */
		e.id = f->id;
		e.tid = f->tid;
		e.slot = f->slot;
		lane_push_front(f->lane, &e);
		f->lane->running--;
		lane_settle(f->lane);
		hash_search(inflight, &p_claim[i].id, HASH_REMOVE, NULL);
		spike->held--;
		spike->returned++;
	}
	for (int i = 0; i < n_claim; i++)
		if (p_claim[i].level < from)
			p_claim[keep++] = p_claim[i];
	n_claim = keep;
}

/* reopen closes with level >= from; lock held */
static void
undo_closes(int from)
{
	int			keep = 0;

	for (int i = 0; i < n_close; i++)
	{
		if (p_close[i].level < from)
		{
			p_close[keep++] = p_close[i];
			continue;
		}
		{
			InFlight   *f = hash_search(inflight, &p_close[i].id, HASH_FIND, NULL);

			if (f != NULL && f->state == IF_CLOSING)
			{
				/* back to this transaction's claim, which undo_claims sees */
				if (p_close[i].was_claiming)
					f->state = IF_CLAIMING;
				/* an earlier heartbeat of this transaction still holds it */
				else if (ext_pending(f->id, from))
					f->state = IF_EXTENDING;
				else
				{
					f->state = IF_OPEN;
					f->xid = InvalidTransactionId;
				}
			}
		}
	}
	n_close = keep;
}

/* undo heartbeats with level >= from; lock held */
static void
undo_exts(int from)
{
	int			keep = 0;

	for (int i = 0; i < n_ext; i++)
	{
		InFlight   *f;

		/* an entry stays EXTENDING while an older heartbeat of ours stays */
		if (p_ext[i].level < from || ext_pending(p_ext[i].id, from))
			continue;
		f = hash_search(inflight, &p_ext[i].id, HASH_FIND, NULL);
		if (f != NULL && f->state == IF_EXTENDING)
		{
			f->state = IF_OPEN;
			f->xid = InvalidTransactionId;
		}
	}
	for (int i = 0; i < n_ext; i++)
		if (p_ext[i].level < from)
			p_ext[keep++] = p_ext[i];
	n_ext = keep;
}

static void
spike_xact_callback(XactEvent event, void *arg)
{
	bool		pending = n_enq > 0 || n_claim > 0 || n_close > 0 || n_ext > 0 ||
		n_reloc > 0 || any_writer || my_truncating >= 0 || my_due || my_promoting;

	if (!pending || spike == NULL)
		return;

	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("cannot PREPARE a transaction that enqueued, claimed, heartbeated or finished jobs of pgjq_spike")));
			break;
		case XACT_EVENT_PRE_COMMIT:
			/*
			 * resolve and pin the lanes, reserve node room: the commit
			 * callback must not fail
			 */
			if (n_enq > 0)
			{
				LWLockAcquire(spike->lock, LW_EXCLUSIVE);
				for (int i = 0; i < n_enq; i++)
				{
					Lane	   *l;

					if (i > 0 && memcmp(&p_enq[i].key, &p_enq[i - 1].key, sizeof(LaneKey)) == 0)
						l = p_enq[i - 1].lane;
					else if (ring_for(p_enq[i].key.priority, true) == NULL)
					{
						LWLockRelease(spike->lock);
						ereport(ERROR,
								(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
								 errmsg("pgjq_spike supports at most %d distinct priorities", MAX_PRIOS)));
					}
					else if ((l = lane_get(&p_enq[i].key)) == NULL)
					{
						LWLockRelease(spike->lock);
						ereport(ERROR,
								(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
								 errmsg("pgjq_spike has no room for another lane (%d in use)", max_lanes),
								 errhint("Raise pgjq_spike.max_lanes.")));
					}
					l->pinned++;
					p_enq[i].lane = l;
				}
				if ((int64) spike->count + spike->reserved + spike->held + n_enq > lane_capacity)
				{
					LWLockRelease(spike->lock);
					ereport(ERROR,
							(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
							 errmsg("pgjq_spike lane is full (%d positions)", lane_capacity),
							 errhint("Raise pgjq_spike.lane_capacity or drain the queue.")));
				}
				spike->reserved += n_enq;
				my_reserved = n_enq;
				LWLockRelease(spike->lock);
			}
			break;
		case XACT_EVENT_COMMIT:
			LWLockAcquire(spike->lock, LW_EXCLUSIVE);
			for (int i = 0; i < n_enq; i++)
			{
				Lane	   *l = p_enq[i].lane;

				lane_push_back(l, &p_enq[i].e);
				l->pinned--;
				lane_settle(l);
				spike->slots[p_enq[i].e.slot].open++;
			}
			spike->published += n_enq;
			spike->reserved -= my_reserved;
			for (int s = 0; s < SPIKE_NSLOTS; s++)
				if (my_writer[s])
					spike->slots[s].writers--;
			for (int i = 0; i < n_claim; i++)
			{
				InFlight   *f = hash_search(inflight, &p_claim[i].id, HASH_FIND, NULL);

				if (f != NULL && f->state == IF_CLAIMING)
				{
					f->state = IF_OPEN;
					f->xid = InvalidTransactionId;
					spike->held--;
				}
			}
			for (int i = 0; i < n_reloc; i++)
			{
				InFlight   *f = hash_search(inflight, &p_reloc[i].id, HASH_FIND, NULL);

				/* still the same claim in the old slot: point to the copy */
				if (f != NULL && f->token == p_reloc[i].token && f->slot == p_reloc[i].old_slot)
				{
					spike->slots[f->slot].open--;
					spike->slots[p_reloc[i].slot].open++;
					f->tid = p_reloc[i].tid;
					f->slot = p_reloc[i].slot;
					spike->relocated++;
				}
			}
			for (int i = 0; i < n_ext; i++)
			{
				InFlight   *f = hash_search(inflight, &p_ext[i].id, HASH_FIND, NULL);

				if (f != NULL && f->state == IF_EXTENDING)
				{
					f->state = IF_OPEN;
					f->xid = InvalidTransactionId;
				}
				if (f != NULL && f->lease_until < p_ext[i].lease_until)
					f->lease_until = p_ext[i].lease_until;
			}
			for (int i = 0; i < n_close; i++)
			{
				InFlight   *f = hash_search(inflight, &p_close[i].id, HASH_FIND, NULL);

				if (f != NULL && f->state == IF_CLOSING)
				{
					Lane	   *l = f->lane;

					spike->slots[f->slot].open--;
					hash_search(inflight, &p_close[i].id, HASH_REMOVE, NULL);
					/* a parked key runs again once a job of it is closed */
					l->running--;
					lane_settle(l);
					spike->completed++;
					/* closed before its claim ever became OPEN */
					if (p_close[i].was_claiming)
						spike->held--;
				}
			}
			spike->completed -= my_failed + my_rescued;
			spike->failed += my_failed;
			spike->rescued += my_rescued;
			if (my_truncating >= 0)
			{
				SlotState  *st = &spike->slots[my_truncating];

				st->truncating = false;
				st->sealed = false;
				st->clean = true;
				st->appended = 0;
				spike->truncations++;
			}
			if (my_due && my_due_min < spike->next_due)
			{
				spike->next_due = my_due_min;
				spike->due_gen++;
			}
			else
				my_due = false; /* nothing to tell the promoter */
			if (my_promoting)
			{
				/*
				 * a producer that scheduled an earlier job after the pass's
				 * snapshot bumped the generation: keep the earlier time
				 */
				if (spike->due_gen == my_due_gen)
					spike->next_due = my_next_due;
				else if (my_next_due < spike->next_due)
					spike->next_due = my_next_due;
				spike->promoted += my_promoted;
			}
			LWLockRelease(spike->lock);
			/* waiting claims: new jobs, or keys that may run again */
			if (n_enq > 0 || n_close > 0)
				ConditionVariableBroadcast(&spike->wake);
			if (my_due)
				ConditionVariableBroadcast(&spike->due);
			reset_local();
			break;
		case XACT_EVENT_ABORT:
			LWLockAcquire(spike->lock, LW_EXCLUSIVE);
			for (int i = 0; i < n_enq; i++)
				if (p_enq[i].lane != NULL)
				{
					p_enq[i].lane->pinned--;
					lane_settle(p_enq[i].lane);
				}
			spike->reserved -= my_reserved;
			for (int s = 0; s < SPIKE_NSLOTS; s++)
				if (my_writer[s])
					spike->slots[s].writers--;
			undo_closes(0);
			undo_exts(0);
			undo_claims(0);
			if (my_truncating >= 0)
				spike->slots[my_truncating].truncating = false;
			LWLockRelease(spike->lock);
			reset_local();
			break;
		default:
			break;
	}
}

static void
spike_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			level;

	if (spike == NULL ||
		(n_enq == 0 && n_claim == 0 && n_close == 0 && n_ext == 0 && n_reloc == 0 &&
		 my_truncating < 0))
		return;
	level = GetCurrentTransactionNestLevel();
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		int			keep = 0;

		/* rows of a rolled-back savepoint are never published */
		for (int i = 0; i < n_enq; i++)
			if (p_enq[i].level < level)
				p_enq[keep++] = p_enq[i];
		n_enq = keep;
		keep = 0;
		for (int i = 0; i < n_reloc; i++)
			if (p_reloc[i].level < level)
				p_reloc[keep++] = p_reloc[i];
		n_reloc = keep;
		LWLockAcquire(spike->lock, LW_EXCLUSIVE);
		undo_closes(level);
		undo_exts(level);
		undo_claims(level);
		if (my_truncating >= 0 && my_truncating_level >= level)
		{
			spike->slots[my_truncating].truncating = false;
			my_truncating = -1;
		}
		LWLockRelease(spike->lock);
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (int i = 0; i < n_enq; i++)
			if (p_enq[i].level >= level)
				p_enq[i].level = level - 1;
		for (int i = 0; i < n_claim; i++)
			if (p_claim[i].level >= level)
				p_claim[i].level = level - 1;
		for (int i = 0; i < n_close; i++)
			if (p_close[i].level >= level)
				p_close[i].level = level - 1;
		for (int i = 0; i < n_ext; i++)
			if (p_ext[i].level >= level)
				p_ext[i].level = level - 1;
		for (int i = 0; i < n_reloc; i++)
			if (p_reloc[i].level >= level)
				p_reloc[i].level = level - 1;
		if (my_truncating >= 0 && my_truncating_level >= level)
			my_truncating_level = level - 1;
	}
}

/* ---------------------------------------------------------------------
 * rebuild: shared memory from the durable rows
 * --------------------------------------------------------------------- */
typedef struct RbPair
{
	int64		id;
	int64		token;
} RbPair;

typedef struct RbClaim			/* the newest claim of a job */
{
	int64		id;				/* key */
	int64		token;
	TimestampTz lease_until;
} RbClaim;

typedef struct RbBeat			/* the latest heartbeat of a claim */
{
	RbPair		key;
	TimestampTz lease_until;
} RbBeat;

typedef struct RbBody			/* the newest version of a job */
{
	int64		id;				/* key */
	int64		after;
	ItemPointerData tid;
	uint16		slot;
	LaneKey		key;
} RbBody;

typedef struct RbPos			/* a position to put back, and its lane */
{
	LaneEntry	e;
	LaneKey		key;
} RbPos;

static HTAB *
rb_hash(const char *name, Size keysize, Size entrysize, long n)
{
	HASHCTL		ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = keysize;
	ctl.entrysize = entrysize;
	ctl.hcxt = CurrentMemoryContext;
	return hash_create(name, Max(n, 1024), &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static int
int8_elems(Datum arr, int64 **out)
{
	ArrayType  *a = DatumGetArrayTypeP(arr);
	Datum	   *elems;
	int			n;

	deconstruct_array(a, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &elems, NULL, &n);
	*out = palloc(sizeof(int64) * Max(n, 1));
	for (int i = 0; i < n; i++)
		(*out)[i] = DatumGetInt64(elems[i]);
	return n;
}

static int
lane_entry_cmp(const void *a, const void *b)
{
	int64		x = ((const RbPos *) a)->e.id;
	int64		y = ((const RbPos *) b)->e.id;

	return (x > y) - (x < y);
}

/*
 * Rebuild the lane, the in-flight table and the slot counters from what
 * committed: a full scan of the live body slots, the ledger and the outcome
 * rows (stage 2's form; the engine bounds it with per-lane checkpoints).
 * The caller holds ExclusiveLock on done and nothing else runs pgjq calls
 * (the state is not ready), so no claim or outcome is uncommitted now.
 *
 * A job is its newest version (the body row with the largest after_token).
 * Its claim is the newest claim of its id with a token above that
 * after_token: tokens are drawn in order, and a version is appended only by
 * the transaction that closes the claim before it, so a claim of the
 * current version has a larger token than its after_token.  No such claim:
 * ready.  Such a claim, closed in done: finished.  Otherwise in flight, with
 * the lease of the claim or of its latest heartbeat, whichever is later: a
 * job leased before the crash is not handed out before that lease ends.
 */
static void
rebuild_state(double *ms, int64 *nready_out, int64 *ninflight_out, int64 *nrows_out)
{
	TimestampTz start = GetCurrentTimestamp();
	MemoryContext ctx = AllocSetContextCreate(CurrentMemoryContext, "pgjq_spike rebuild",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(ctx);
	Snapshot	snap = RegisterSnapshot(GetLatestSnapshot());
	HTAB	   *claims = rb_hash("rb claims", sizeof(int64), sizeof(RbClaim), 65536);
	HTAB	   *beats = rb_hash("rb beats", sizeof(RbPair), sizeof(RbBeat), 1024);
	HTAB	   *closed = rb_hash("rb closed", sizeof(RbPair), sizeof(RbPair), 65536);
	HTAB	   *bodies = rb_hash("rb bodies", sizeof(int64), sizeof(RbBody), 65536);
	int64		rows[SPIKE_NSLOTS] = {0};
	int64		open[SPIKE_NSLOTS] = {0};
	BlockNumber pages[SPIKE_NSLOTS];
	int64		maxid = -1;
	int			cur = 0;
	RbPos	   *ready;
	InFlight   *fl;
	LaneKey    *flkey;
	int64		nready = 0,
				nfl = 0,
				nrows = 0;
	HASH_SEQ_STATUS hs;
	RbBody	   *b;

	/* the ledger: claims (kind NULL) and heartbeats ('h') */
	{
		Relation	rel = table_open(ledger_oid, AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull,
						kind_null;
			int64		token = DatumGetInt64(heap_getattr(tup, 1, desc, &isnull));
			TimestampTz lease = DatumGetTimestampTz(heap_getattr(tup, 2, desc, &isnull));
			Datum		kind = heap_getattr(tup, 3, desc, &kind_null);
			int64	   *ids;
			int			n = int8_elems(heap_getattr(tup, 4, desc, &isnull), &ids);

			for (int i = 0; i < n; i++)
			{
				bool		found;

				if (kind_null)
				{
					RbClaim    *c = hash_search(claims, &ids[i], HASH_ENTER, &found);

					if (!found || c->token < token)
					{
						c->token = token;
						c->lease_until = lease;
					}
				}
				else if (DatumGetChar(kind) == 'h')
				{
					RbPair		k = {ids[i], token};
					RbBeat	   *hb = hash_search(beats, &k, HASH_ENTER, &found);

					if (!found || hb->lease_until < lease)
						hb->lease_until = lease;
				}
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}

	/* closures: completed, failed, rescued */
	{
		Relation	rel = table_open(done_oid, AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull;
			int64	   *toks,
					   *ids;
			int			nt = int8_elems(heap_getattr(tup, 3, desc, &isnull), &toks);
			int			n = int8_elems(heap_getattr(tup, 4, desc, &isnull), &ids);

			for (int i = 0; i < n; i++)
			{
				RbPair		k = {ids[i], nt == 1 ? toks[0] : toks[i]};

				hash_search(closed, &k, HASH_ENTER, NULL);
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}

	/* the live ring: the newest version of every job */
	for (int s = 0; s < SPIKE_NSLOTS; s++)
	{
		Relation	rel = table_open(body_oid[s], AccessShareLock);
		TableScanDesc scan = table_beginscan(rel, snap, 0, NULL);
		TupleDesc	desc = RelationGetDescr(rel);
		HeapTuple	tup;

		pages[s] = RelationGetNumberOfBlocks(rel);
		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			bool		isnull,
						found;
			int64		id = DatumGetInt64(heap_getattr(tup, BODY_ID, desc, &isnull));
			Datum		after = heap_getattr(tup, BODY_AFTER, desc, &isnull);
			int64		a = isnull ? 0 : DatumGetInt64(after);

			b = hash_search(bodies, &id, HASH_ENTER, &found);
			if (!found || b->after < a)
			{
				int16		prio;
				char	   *key;

				b->after = a;
				b->tid = tup->t_self;
				b->slot = s;
				body_lane(tup, desc, &prio, &key);
				lane_key(&b->key, prio, key);
			}
			rows[s]++;
			nrows++;
			/* the newest job marks the slot producers appended to last */
			if (id > maxid)
			{
				maxid = id;
				cur = s;
			}
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}

	ready = palloc(sizeof(RbPos) * Max(hash_get_num_entries(bodies), 1));
	fl = palloc(sizeof(InFlight) * Max(hash_get_num_entries(bodies), 1));
	flkey = palloc(sizeof(LaneKey) * Max(hash_get_num_entries(bodies), 1));
	hash_seq_init(&hs, bodies);
	while ((b = hash_seq_search(&hs)) != NULL)
	{
		RbClaim    *c = hash_search(claims, &b->id, HASH_FIND, NULL);

		if (c == NULL || c->token <= b->after)
		{
			ready[nready].e.id = b->id;
			ready[nready].e.tid = b->tid;
			ready[nready].e.slot = b->slot;
			ready[nready].key = b->key;
			nready++;
		}
		else
		{
			RbPair		k = {b->id, c->token};
			RbBeat	   *hb;

			if (hash_search(closed, &k, HASH_FIND, NULL) != NULL)
				continue;		/* finished */
			hb = hash_search(beats, &k, HASH_FIND, NULL);
			memset(&fl[nfl], 0, sizeof(InFlight));
			fl[nfl].id = b->id;
			fl[nfl].token = c->token;
			fl[nfl].lease_until = c->lease_until;
			if (hb != NULL && hb->lease_until > c->lease_until)
				fl[nfl].lease_until = hb->lease_until;
			fl[nfl].xid = InvalidTransactionId;
			fl[nfl].tid = b->tid;
			fl[nfl].slot = b->slot;
			fl[nfl].state = IF_OPEN;
			flkey[nfl] = b->key;
			nfl++;
		}
		open[b->slot]++;
	}
	UnregisterSnapshot(snap);

	if (nready > lane_capacity)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("pgjq_spike cannot rebuild: " INT64_FORMAT " jobs are ready, the lane holds %d",
						nready, lane_capacity),
				 errhint("Raise pgjq_spike.lane_capacity and restart.")));
	if (nfl > max_in_flight)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("pgjq_spike cannot rebuild: " INT64_FORMAT " jobs are in flight, the table holds %d",
						nfl, max_in_flight),
				 errhint("Raise pgjq_spike.max_in_flight and restart.")));
	/* enqueue order, as far as ids tell it */
	qsort(ready, nready, sizeof(RbPos), lane_entry_cmp);

	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	{
		InFlight   *f;
		int64		rebuilds = spike->rebuilds;

		Lane	   *l;

		hash_seq_init(&hs, inflight);
		while ((f = hash_seq_search(&hs)) != NULL)
			hash_search(inflight, &f->id, HASH_REMOVE, NULL);
		hash_seq_init(&hs, lanes);
		while ((l = hash_seq_search(&hs)) != NULL)
			hash_search(lanes, &l->key, HASH_REMOVE, NULL);
		memset(((char *) spike) + offsetof(SpikeShared, ready), 0,
			   offsetof(SpikeShared, nodes) - offsetof(SpikeShared, ready));
		lanes_clear();
		spike->rebuilds = rebuilds + 1;
	}
	for (int64 i = 0; i < nfl + nready; i++)
	{
		const LaneKey *k = i < nfl ? &flkey[i] : &ready[i - nfl].key;
		Lane	   *l = NULL;

		if (ring_for(k->priority, true) == NULL || (l = lane_get(k)) == NULL)
		{
			LWLockRelease(spike->lock);
			ereport(ERROR,
					(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
					 errmsg("pgjq_spike cannot rebuild: more lanes or priorities than it holds"),
					 errhint("Raise pgjq_spike.max_lanes and restart.")));
		}
		if (i < nfl)
		{
			/* the table was emptied and holds max_in_flight: cannot fail */
			InFlight   *f = hash_search(inflight, &fl[i].id, HASH_ENTER_NULL, NULL);

			if (f != NULL)
			{
				*f = fl[i];
				f->lane = l;
				l->running++;
			}
		}
		else
			lane_push_back(l, &ready[i - nfl].e);
	}
	{
		Lane	   *l;

		hash_seq_init(&hs, lanes);
		while ((l = hash_seq_search(&hs)) != NULL)
			lane_settle(l);
	}
	for (int s = 0; s < SPIKE_NSLOTS; s++)
	{
		SlotState  *st = &spike->slots[s];

		st->open = open[s];
		st->appended = rows[s];
		if (s == cur)
			continue;			/* current: not sealed, not clean */
		if (pages[s] == 0)
			st->clean = true;
		else
			st->sealed = true;	/* truncated once its open count is 0 */
	}
	spike->cur_slot = cur;
	spike->dbid = MyDatabaseId;
	spike->ready = true;
	LWLockRelease(spike->lock);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(ctx);
	if (ms)
		*ms = (double) (GetCurrentTimestamp() - start) / 1000.0;
	if (nready_out)
		*nready_out = nready;
	if (ninflight_out)
		*ninflight_out = nfl;
	if (nrows_out)
		*nrows_out = nrows;
	elog(LOG, "pgjq_spike: rebuilt from %lld body rows: %lld ready, %lld in flight, in %.1f ms",
		 (long long) nrows, (long long) nready, (long long) nfl,
		 (double) (GetCurrentTimestamp() - start) / 1000.0);
}

/*
 * spike_rebuild(): rebuild now and say how long it took.  After a restart
 * it is the first call (no other may be active); on a running server the
 * caller makes sure no other session is active (like spike_reset).
 */
PG_FUNCTION_INFO_V1(spike_rebuild);
Datum
spike_rebuild(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[4];
	bool		nulls[4] = {0};
	double		ms;
	int64		nready,
				nfl,
				nrows;

	if (spike == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq_spike is not loaded"),
				 errhint("Add pgjq_spike to shared_preload_libraries and restart.")));
	if (n_enq > 0 || n_claim > 0 || n_close > 0 || n_ext > 0 || any_writer)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq.spike_rebuild() must run in a transaction of its own")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	/* the relation OIDs, without check_ready's rebuild */
	lookup_oids();
	LockRelationOid(done_oid, ExclusiveLock);
	spike->ready = false;
	rebuild_state(&ms, &nready, &nfl, &nrows);
	UnlockRelationOid(done_oid, ExclusiveLock);
	values[0] = Float8GetDatum(ms);
	values[1] = Int64GetDatum(nready);
	values[2] = Int64GetDatum(nfl);
	values[3] = Int64GetDatum(nrows);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* ---------------------------------------------------------------------
 * maintenance and observability
 * --------------------------------------------------------------------- */
PG_FUNCTION_INFO_V1(spike_reset);
Datum
spike_reset(PG_FUNCTION_ARGS)
{
	HASH_SEQ_STATUS hs;
	InFlight   *f;

	if (spike == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq_spike is not loaded"),
				 errhint("Add pgjq_spike to shared_preload_libraries and restart.")));
	if (n_enq > 0 || n_claim > 0 || n_close > 0 || n_ext > 0 || any_writer)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq.spike_reset() must run in a transaction of its own")));
	cached_db = InvalidOid;
	spike->ready = false;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	SPI_execute("TRUNCATE pgjq.body_0, pgjq.body_1, pgjq.body_2, pgjq.body_3, pgjq.ledger, pgjq.done, pgjq.sched",
				false, 0);
	SPI_finish();

	/* not transactional: the caller makes sure nobody else is active */
	LWLockAcquire(spike->lock, LW_EXCLUSIVE);
	hash_seq_init(&hs, inflight);
	while ((f = hash_seq_search(&hs)) != NULL)
		hash_search(inflight, &f->id, HASH_REMOVE, NULL);
	{
		Lane	   *l;

		hash_seq_init(&hs, lanes);
		while ((l = hash_seq_search(&hs)) != NULL)
			hash_search(lanes, &l->key, HASH_REMOVE, NULL);
	}
	memset(((char *) spike) + offsetof(SpikeShared, ready), 0,
		   offsetof(SpikeShared, nodes) - offsetof(SpikeShared, ready));
	lanes_clear();
	for (int s = 0; s < SPIKE_NSLOTS; s++)
		spike->slots[s].clean = (s != 0);
	spike->cur_slot = 0;
	spike->dbid = MyDatabaseId;
	spike->ready = true;
	LWLockRelease(spike->lock);
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(spike_stats);
Datum
spike_stats(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[18];
	bool		nulls[18] = {0};
	Datum		open[SPIKE_NSLOTS],
				app[SPIKE_NSLOTS];
	int64		nlanes;

	if (spike == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq_spike is not loaded")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	LWLockAcquire(spike->lock, LW_SHARED);
	values[0] = Int64GetDatum(spike->count);
	values[1] = Int64GetDatum(hash_get_num_entries(inflight));
	values[2] = Int64GetDatum(spike->published);
	values[3] = Int64GetDatum(spike->claimed);
	values[4] = Int64GetDatum(spike->completed);
	values[5] = Int64GetDatum(spike->stale);
	values[6] = Int64GetDatum(spike->returned);
	values[7] = Int64GetDatum(spike->truncations);
	values[8] = Int64GetDatum(spike->ring_full);
	values[9] = Int64GetDatum(spike->rescued);
	values[10] = Int64GetDatum(spike->failed);
	values[11] = Int64GetDatum(spike->rebuilds);
	values[12] = Int64GetDatum(spike->relocated);
	nlanes = hash_get_num_entries(lanes);
	values[13] = Int32GetDatum(spike->cur_slot);
	for (int s = 0; s < SPIKE_NSLOTS; s++)
	{
		open[s] = Int64GetDatum(spike->slots[s].open);
		app[s] = Int64GetDatum(spike->slots[s].appended);
	}
	LWLockRelease(spike->lock);
	values[14] = PointerGetDatum(construct_array(open, SPIKE_NSLOTS, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[15] = PointerGetDatum(construct_array(app, SPIKE_NSLOTS, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[16] = Int64GetDatum(nlanes);
	values[17] = Int64GetDatum(spike->promoted);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	DefineCustomIntVariable("pgjq_spike.lane_capacity",
							"Positions the lane can hold (published, being claimed, being committed).",
							NULL, &lane_capacity, 1048576, 1024, 64 * 1024 * 1024,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq_spike.max_in_flight",
							"Jobs that can be claimed and not yet completed.",
							NULL, &max_in_flight, 65536, 64, 16 * 1024 * 1024,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq_spike.slot_rows",
							"Rows appended to a body slot before producers move to the next one.",
							NULL, &slot_rows, 100000, 1, INT_MAX,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq_spike.relocate_max",
							"Unfinished jobs a sealed slot may hold and still have them copied forward so that it can be truncated.",
							NULL, &relocate_max, 1000, 0, 1000000,
							PGC_SUSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq_spike.max_lanes",
							"Lanes (priority, fair key) with jobs ready or running.",
							NULL, &max_lanes, 65536, 16, 16 * 1024 * 1024,
							PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("pgjq_spike.key_concurrency",
							"Jobs of one fair key that may run at once (0: no limit).",
							NULL, &key_concurrency, 0, 0, INT_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("pgjq_spike");
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = spike_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = spike_shmem_startup;
	RegisterXactCallback(spike_xact_callback, NULL);
	RegisterSubXactCallback(spike_subxact_callback, NULL);
}
