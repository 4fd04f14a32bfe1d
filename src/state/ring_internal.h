/*-------------------------------------------------------------------------
 *
 * ring_internal.h
 *	  The ring engine's shared-memory layout and transaction-local state,
 *	  shared by ring_shmem.c (allocation), ring_records.c (the records),
 *	  ring_xact.c (transaction notes and callbacks), key_rate.c,
 *	  ring_holds.c and the engine's ring files.  Within state/ the files use
 *	  each other in that order only: ring_xact.c uses ring_records.c, both
 *	  use ring_shmem.c; key_rate.c and ring_holds.c use ring_records.c.
 *
 * Locking rules: one LWLock (ring->lock) protects every shared field here:
 * the per-database records and their slots, the queue records, the lanes
 * and their node pool, the in-flight table.  It is never held across heap
 * access, WAL, a heavyweight-lock wait, or anything that can raise an error
 * (callers check bounds and release it before they raise).
 *
 * Where a job is: a producer's pending list (appended, not committed), a
 * lane (committed, claimable), the in-flight table as CLAIMING (claimed by
 * an open transaction), OPEN (claim committed: its token is valid),
 * EXTENDING (open, and an open transaction heartbeats it or requests its
 * cancellation: that holds from its commit, and rescue and other outcomes
 * wait for it) or
 * CLOSING (an open transaction completes, moves or removes it), or gone (its
 * close committed).  Every move between these happens under the lock, in a
 * call or in a commit or abort callback; the callbacks never allocate and
 * never fail: node room and lanes are reserved when a job is appended, and
 * in-flight entries exist from the claim on.
 *
 * Invariants (docs/design.md, "Durability"; pgjq.verify() checks those
 * marked [v] against the tables, engine/ring_verify.c):
 *	 I1 [v] every unfinished job of the tables is in one place here, a lane
 *		(ready) or the in-flight table (with the token of its newest claim),
 *		pointing at its newest body; no finished job is.
 *	 I2 [v] a slot's `open` counts its bodies' unfinished jobs.
 *	 I3 [v] the ring order is durable: a slot with committed rows has the
 *		generation of its 'g' rows (none: written by 0.2.0), `marked` implies
 *		a committed 'g' row, a slot in use is not `clean`, and cur_slot is the
 *		slot of the newest generation unless it holds nothing committed yet.
 *		So a slot is truncated only when it is the oldest in use (the log
 *		rows of live jobs are never in a slot older than their bodies).
 *	 I4 [v] count + reserved + held <= pgjq.ring_positions.
 *	 I5 [v] count is the positions in lanes (all databases), a lane's count
 *		its list, held the claims not committed; a lane exists while it has
 *		ready or running jobs, pins or a hold, and its priority's record
 *		exactly while lanes of it exist (nlanes).
 *	 I6 every callback (ring_xact.c) keeps these without allocating or
 *		failing.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_INTERNAL_H
#define PGJQ_RING_INTERNAL_H

#include "common/crash_points.h"
#include "common/guc.h"
#include "common/queue_types.h"
#include "state/ring_records.h"
#include "state/ring_shmem.h"
#include "state/ring_xact.h"

#include "storage/itemptr.h"
#include "storage/lwlock.h"
#include "utils/hsearch.h"

#define RING_NSLOTS		4

/* a published position: which job, where its body is */
typedef struct RingPos
{
	int64		id;
	TimestampTz enqueued_at;	/* for oldest_ready_age and the history */
	ItemPointerData tid;
	uint16		slot;
} RingPos;

typedef struct RingNode
{
	RingPos		p;				/* p.id is 0 while the node is free */
	int32		next;			/* next node of the lane or free list, -1 */
} RingNode;

typedef struct RingQueue RingQueue;
typedef struct RingPrio RingPrio;

/*
 * A lane: the ready jobs of one (queue, priority, fair key), in publication
 * order, as a list of nodes of the shared pool.  Lanes with jobs are linked
 * in their queue's ring for that priority; a claim takes one job per lane
 * per turn (the first job of every key, then the second...).  Fair keys are
 * hashed to 64 bits: a collision merges two keys' turns, nothing else.
 */
typedef struct RingLaneKey
{
	Oid			dbid;
	int32		queue_id;
	uint64		keyhash;		/* 0: no fair key */
	int32		priority;
	int32		pad;			/* zeroed: keys are hashed as bytes */
} RingLaneKey;

typedef struct RingLane
{
	RingLaneKey key;
	int32		head;			/* first node, -1 when empty */
	int32		tail;
	int32		count;			/* ready jobs */
	int32		running;		/* its jobs in the in-flight table */
	int32		pinned;			/* positions open producers will push */
	bool		linked;
	bool		parked;			/* its key is at key_concurrency: out of the
								 * ring until a job of the key ends */
	RingQueue  *queue;
	RingPrio   *prio;			/* its priority's ring, there while it is */
	struct RingLane *prev;		/* ring links (shared memory has the same */
	struct RingLane *next;		/* address in every backend) */
} RingLane;

/*
 * The round robin of one (queue, priority): a record of the shared pool
 * ring_prios, there exactly while lanes of the priority exist (linked,
 * parked, held, throttled, pinned by a producer or only running), so every
 * lane can always be linked again.  A queue lists its priorities in
 * ascending order; the pool is as large as the lane table, so a lane that
 * fits always finds room for its priority.
 */
typedef struct RingPrioKey
{
	Oid			dbid;
	int32		queue_id;
	int32		priority;
} RingPrioKey;

struct RingPrio
{
	RingPrioKey key;
	RingLane   *head;			/* next lane to take from; NULL when none */
	int32		parked;			/* its lanes parked */
	int32		nlanes;			/* its lanes in ring_lanes */
	RingPrio   *prev;			/* the queue's priorities, ascending */
	RingPrio   *next;
};

/*
 * A queue's record: there while the queue has lanes; an empty one (which
 * keeps only table_maybe: a missing record means "maybe") goes when its
 * queue is dropped or when the table is full and another queue needs one.
 */
typedef struct RingQueueKey
{
	Oid			dbid;
	int32		queue_id;
} RingQueueKey;

struct RingQueue
{
	RingQueueKey key;
	int32		nprios;
	RingPrio   *prios;			/* ascending: lower runs first */
	int32		lanes;			/* lanes of this queue in the hash */
	int64		ready;
	int64		running;		/* in flight, claims not committed too */
	int64		claiming;		/* in flight by claims not committed */
	int64		claiming_own;	/* of them, jobs the claimer enqueued */
	bool		table_maybe;	/* pgjq.job may have ready rows of the queue */
	uint64		table_gen;		/* bumped whenever table_maybe is set; unique
								 * across records (RingShared.table_gen) */
};

typedef enum RingFlightState
{
	RF_CLAIMING,				/* claimed by xid, not committed */
	RF_OPEN,					/* claim committed: the token is valid */
	RF_CLOSING,					/* completed, moved or removed by xid */
	RF_EXTENDING				/* open, its lease extended (heartbeat) or its
								 * cancellation requested by xid: it holds
								 * from xid's commit */
} RingFlightState;

typedef struct RingFlightKey
{
	int64		id;
	Oid			dbid;
	int32		pad;
} RingFlightKey;

typedef struct RingFlight
{
	RingFlightKey key;
	int64		token;
	TimestampTz lease_until;
	TimestampTz deadline;		/* the queue's timeout from the claim: no
								 * lease goes past it; 0: none */
	TimestampTz enqueued_at;
	TransactionId xid;			/* owner while CLAIMING or CLOSING */
	ItemPointerData tid;
	uint16		slot;
	uint8		state;
	bool		pending;		/* its enqueue is this claimer's, uncommitted */
	bool		cancel_requested;	/* cancel() of the running job committed */
	bool		anchored;		/* has a dedup anchor in pgjq.job (its body
								 * has a dedup_key): the end deletes it */
	int32		attempt;
	int32		queue_id;
	RingLane   *lane;			/* its running count is one of this entry */
	/* a relocated copy of its body, taken on when the owner's xact ends */
	ItemPointerData reloc_tid;
	uint16		reloc_slot;		/* RING_NO_SLOT: none */
	TransactionId reloc_xid;	/* the relocation's (RingSlot.left_xid) */
	/* its claim's 'c' row, where job(id) reads the worker (checked there) */
	ItemPointerData claim_tid;
	uint16		claim_slot;		/* RING_NO_SLOT: unknown */
} RingFlight;

#define RING_NO_SLOT	0xFFFF

/*
 * A held fair key (key_hold.c): claims skip its lanes until `until`.  A
 * transaction that changes it (xid, not yet committed) leaves `until` as it
 * is and sets new_until, taken on at its commit (0: a release).
 */
typedef struct RingHoldKey
{
	Oid			dbid;
	int32		queue_id;
	uint64		keyhash;		/* 0: the jobs without a fair key */
} RingHoldKey;

typedef struct RingHold
{
	RingHoldKey key;
	TimestampTz until;			/* in effect: 0 while only pending */
	TimestampTz new_until;
	TransactionId xid;
} RingHold;

typedef struct RingSlot
{
	int64		open;			/* committed jobs not finished */
	int64		appended;		/* body rows since it was last empty */
	int32		writers;		/* transactions that may still write to it */
	bool		sealed;			/* no longer current */
	bool		clean;			/* empty (truncated, committed), not in use */
	bool		truncating;

	/*
	 * The ring order, durable: when producers move to a slot it gets the
	 * database's next generation, and the first transaction that writes to it
	 * also writes a 'g' row (token = gen) into its log; marked once one such
	 * row has committed.  The rebuild orders the slots by their 'g' rows,
	 * never by ids (engine/ring_rebuild.c, current_slot).
	 */
	uint64		gen;			/* 0: clean, or a 0.2.0 slot without 'g' row */
	bool		marked;			/* a committed 'g' row of gen is in its log */

	/*
	 * The newest transaction that finished a job of the slot or moved one out
	 * of it: TRUNCATE is not MVCC-safe, so the slot is truncated only once no
	 * snapshot is older than that (engine/ring_relocate.c, maybe_truncate)
	 */
	TransactionId left_xid;
} RingSlot;

/* one database's ring */
typedef struct RingDb
{
	Oid			dbid;			/* InvalidOid: free */
	Oid			incarnation;	/* pgjq.ring_body_0's OID when built */
	bool		ready;			/* state matches the tables */
	int			cur_slot;
	uint64		gen;			/* the newest slot generation (cur_slot's) */
	bool		stalled;		/* producers found the next slot in use; the
								 * worker was woken (once per truncation) */
	RingSlot	slots[RING_NSLOTS];
	int64		truncations;
	int64		rebuilds;
	int32		nholds;			/* entries of ring_holds of the database */
	TimestampTz hold_next;		/* the earliest end of one of them */
	/* due jobs a promotion left in pgjq.job for want of room (health()) */
	int64		refused;
	TimestampTz refused_at;		/* the latest; 0: none */
	int32		refused_bound;	/* of the latest: 1 queues, 2 lanes, 3
								 * priorities */
	TimestampTz truncate_woken; /* a claim in a block woke the worker to
								 * truncate (engine/ring_relocate.c,
								 * ring_client_truncate) */
} RingDb;

typedef struct RingShared
{
	LWLock	   *lock;
	int64		count;			/* ready positions, all databases */
	int64		reserved;		/* node room reserved by open producers */
	int64		held;			/* CLAIMING entries (they return on abort) */
	int64		parked;			/* parked lanes, all databases */
	int64		nholds;			/* ring_holds entries, all databases */
	uint64		table_gen;		/* the last RingQueue.table_gen handed out */
	int32		free_head;
	int32		ndbs;
	RingDb	   *dbs;			/* [ndbs], after the nodes */
	RingNode	nodes[FLEXIBLE_ARRAY_MEMBER];
} RingShared;

extern RingShared *ring;
extern HTAB *ring_flights;
extern HTAB *ring_lanes;
extern HTAB *ring_queues;
extern HTAB *ring_prios;
extern HTAB *ring_holds;

/* ring_records.c: lanes and queues (caller holds ring->lock) */
extern RingQueue *ring_queue_get(int32 queue_id, bool create);
extern void ring_queue_forget(Oid dbid, int32 queue_id);
extern RingLane *ring_lane_get(const RingLaneKey *key, RingQueue *q);
extern void ring_lane_settle(RingLane *l);
extern void ring_lane_push_back(RingLane *l, const RingPos *p);
extern void ring_lane_push_front(RingLane *l, const RingPos *p);
extern void ring_lane_pop_front(RingLane *l, RingPos *p);
extern bool ring_lane_remove(RingLane *l, int64 id, RingPos *p);
extern RingLane *ring_next_lane(RingQueue *q);
extern void ring_lane_park(RingLane *l);
extern void ring_queue_unpark_all(RingQueue *q);
extern bool ring_queue_claimable(RingQueue *q);
extern uint64 ring_limits_hash(uint64 lanehash);
extern void ring_lane_key(RingLaneKey *k, int32 queue_id, int32 priority, const char *fair_key,
						  int keylen);
extern RingFlight *ring_flight_find(int64 id);
extern RingFlight *ring_flight_enter(int64 id);
extern void ring_flight_remove(int64 id);
extern void ring_clear_db(RingDb *db);
extern void ring_slot_left(RingDb *db, int s, TransactionId xid);
extern void ring_flight_take_reloc(RingDb *db, RingFlight *f);
extern void ring_claim_ended(RingFlight *f);
extern void ring_claim_begun(RingFlight *f);

/* key_rate.c's buckets, in ring_shmem.c (ring->lock) */
typedef struct RingRate
{
	RingHoldKey key;			/* dbid, queue, lane hash of the key */
	double		tokens;			/* as of refilled */
	TimestampTz refilled;
	double		rate;			/* the queue's key_rate when last taken from */
	double		burst;
	TimestampTz throttled_until;	/* 0: not throttled */
} RingRate;

typedef struct RingRateWake
{
	TimestampTz at;
	RingHoldKey key;
} RingRateWake;

typedef struct RingRateHeap
{
	int64		throttled;		/* entries with throttled_until != 0 */
	int32		n;
	RingRateWake w[FLEXIBLE_ARRAY_MEMBER];	/* a min-heap on at */
} RingRateHeap;
extern HTAB *ring_rates;
extern RingRateHeap *ring_rate_heap;

/*
 * ring_shmem.c: the buckets' memory, whether a key is throttled (any mode),
 * and forgetting a database's or a queue's.
 */
extern Size ring_rates_shmem_size(void);
extern void ring_rates_shmem_init(void);
extern bool ring_rates_any(void);	/* any mode: a key is throttled */
extern bool ring_rate_throttled(const RingLaneKey *lk, TimestampTz now);	/* any mode */
extern void ring_rates_clear(Oid dbid, int32 queue_id);

/*
 * key_rate.c (caller holds ring->lock exclusively, unless said otherwise).
 * ring_rate_take: 1 the key's bucket has a token (ring_rate_spend spends it
 * once the job is taken), 0 it has none (its lanes are out until the next
 * token), -1 no entry is free (pgjq.ring_max_rate_keys).
 */
extern int	ring_rate_take(const PgjqQueue *queue, uint64 keyhash, TimestampTz now);
extern void ring_rate_spend(const PgjqQueue *queue, uint64 keyhash);
extern void ring_rates_expire_due(void);	/* no lock held */
extern TimestampTz ring_rates_next(void);	/* any mode */

/* ring_records.c: the lane is held back (lock held in any mode) */
extern bool ring_lane_held(const RingLane *l);

/* ring_holds.c (caller holds ring->lock, unless said otherwise) */
extern void ring_holds_expire(RingDb *db, TimestampTz now);
extern void ring_holds_expire_due(void);	/* no lock held */
extern void ring_holds_settle_key(int32 queue_id, uint64 keyhash);
extern int	ring_holds_held_lanes(RingQueue *q, RingLane **out, int max);
typedef struct RingHoldRow
{
	int32		queue_id;
	uint64		keyhash;
	TimestampTz until;
} RingHoldRow;
extern void ring_hold_key_of(RingHoldKey *k, int32 queue_id, const char *fair_key);

/* a hold until `until` (0: a release), at commit (no lock held) */
extern void ring_holds_note_change(int32 queue_id, const char *fair_key, TimestampTz until);
extern int64 ring_holds_install(RingDb *db, const RingHoldRow *rows, int n);

/* ring_records.c: this database's record (lock held), created if missing */
extern RingDb *ring_db(void);
extern RingDb *ring_db_find(void);	/* never allocates: any lock mode */

/* ring_xact.c: transaction-local state */
typedef struct RingPendingEnq
{
	RingPos		p;
	RingLane   *lane;			/* pinned */
	int			level;
	bool		claimed;		/* claimed by this same transaction */
} RingPendingEnq;

typedef struct RingPendingId
{
	int64		id;
	int			level;
	bool		was_claiming;	/* a close of this transaction's own claim */
	bool		was_extending;	/* a close of a job it heartbeated */
} RingPendingId;

extern void ring_note_enqueued(const RingPos *p, RingLane *lane);
extern void ring_reserve_local(int nenq, int nclaim, int nclose);
extern void ring_note_claimed(int64 id);
extern void ring_own_claiming(int32 queue_id, int64 *mine, int64 *mine_own);
extern int	ring_take_own(int32 queue_id, int max, RingPos *out, RingLane **lanes);
extern void ring_take_own_undo(const RingPos *pos, int n);
extern bool ring_has_own(int32 queue_id);
extern bool ring_take_own_id(int64 id, RingPos *out, RingLane **lane);
extern void ring_reserve_dropped(int n);
extern void ring_note_dropped(const RingPos *p, RingLane *lane);
extern void ring_note_closed(int64 id, bool was_claiming, bool was_extending);
extern void ring_reserve_extended(void);
extern bool ring_cancel_requested_here(int64 id);
extern void ring_note_extended(int64 id, int64 token, TimestampTz lease_until, bool was_open,
							   bool cancel);
extern bool ring_note_writer(int slot);
extern bool ring_marker_written(int slot);
extern void ring_note_marker(int slot, uint64 gen);
extern bool ring_writing(void);
extern void ring_note_truncating(int slot);
extern bool ring_truncating(void);
extern void ring_note_table_touch(int32 queue_id, bool at_commit_only);
extern void ring_note_queue_dropped(int32 queue_id);
extern void ring_reserve_relocated(int n);
extern void ring_note_relocated(int64 id, int32 node, int from, const RingPos *to,
								int64 token, const ItemPointerData *claim_tid);
extern bool ring_touched_here(int32 queue_id);

#endif							/* PGJQ_RING_INTERNAL_H */
