/*-------------------------------------------------------------------------
 *
 * ring_store_internal.h
 *	  What the files of the ring engine's durable side share: the columns of
 *	  the body and log tables, a body row read into memory, the result of a
 *	  scan of the live slots, and the steps one file provides the others.
 *
 * The ring engine's durable side is in files by responsibility; each uses
 * only files listed before it (test/layers-check forbids a circle):
 *
 *	ring_tables.c	the tables: OIDs, bodies and log rows written and read,
 *					the slot to write to, dedup anchors ended
 *	ring_rebuild.c	the first call of a database (ring_ensure_ready), the
 *					scan of the live slots, the rebuild of shared memory
 *	ring_relocate.c truncation of the oldest slot, relocation of stragglers
 *	ring_enqueue.c	enqueue, and publication of appended bodies at commit
 *	ring_promote.c	promotion of due and released jobs from pgjq.job
 *	ring_claim.c	claim
 *	ring_outcome.c	complete, fail, heartbeat, cancel request, rescue reads
 *	ring_take.c		ready jobs taken out: cancel, replace, drop_queue
 *	ring_standby.c	read-only answers from the tables (standby, no preload)
 *	ring_read.c		job(id) and the counts, from shared memory or the tables
 *	ring_verify.c	verify(): shared memory against the tables
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_STORE_INTERNAL_H
#define PGJQ_RING_STORE_INTERNAL_H

#include "state/ring_internal.h"
#include "engine/storage_internal.h"
#include "state/limits.h"
#include "engine/ring.h"
#include "state/wait.h"
#include "state/worker_slots.h"
#include "common/args.h"

#include "access/htup.h"
#include "utils/array.h"
#include "utils/hsearch.h"
#include "utils/rel.h"
#include "utils/snapshot.h"

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
	TransactionId xmin;			/* ring_body_by_id only: who wrote it */
} BodyRow;

/*
 * Whether a job with this body has its dedup anchor in pgjq.job while it
 * runs: a 'waiting' key went with its claim.
 */
#define BODY_ANCHORED_RUNNING(b) ((b)->dedup_key != (Datum) 0 && (b)->dedup_scope != 'w')

/* columns of a log row (sql/pgjq.sql) */
#define L_TOKEN		1
#define L_AT		2
#define L_KIND		3
#define L_IDS		4
#define L_WORKER	5
#define L_DEADLINE	6
#define L_NATTS		6

/* ring_rebuild.c: the scan of the live slots (ring_scan_tables) */
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

/* ring_standby.c: the counts of one queue, from the tables */
typedef struct StandbyCount
{
	int32		queue_id;		/* key */
	int64		ready;
	int64		running;
	TimestampTz oldest;
} StandbyCount;

/* ring_tables.c: relation OIDs of this database, looked up once per backend and database */
extern Oid	ring_cached_db;
extern Oid	ring_body_oid[RING_NSLOTS];
extern Oid	ring_log_oid[RING_NSLOTS];
extern Oid	ring_jobseq_oid;
extern void ring_lookup_oids(void);
extern bool ring_tables_known(void);

/* ring_tables.c: slots, bodies and log rows */
extern int	ring_slot_for_write(int appending);
extern void ring_body_read(HeapTuple tup, TupleDesc desc, BodyRow *b);
extern void ring_body_fetch(Relation rel, int64 id, ItemPointer tid, BodyRow *b);
extern void ring_body_lane_key(const BodyRow *b, RingLaneKey *k);
extern void ring_body_append(int s, int n, const BodyRow *rows, ItemPointerData *tids);
extern bool ring_body_by_id(int64 id, BodyRow *out, int *slot, ItemPointerData *tid,
							bool latest);
extern ArrayType *ring_int8_array(const int64 *v, int n);
extern void ring_log_append_to(int s, int64 token, TimestampTz at, char kind, const int64 *ids,
							   int n, const char *worker, TimestampTz deadline, ItemPointer tid);
extern void ring_log_append(int64 token, TimestampTz at, char kind, const int64 *ids, int n);
extern void ring_log_closes(char kind, TimestampTz at, int n, const int64 *ids,
							const int64 *toks);
extern char *ring_claim_worker(int slot, ItemPointer tid, int64 token);
extern int64 ring_next_token(int64 *token);
extern void ring_anchors_end(int n, const int64 *ids);
extern Snapshot ring_read_snapshot(bool latest);

/* ring_rebuild.c */
extern bool ring_ensure_ready(bool must);
extern void ring_forget_gone_databases(void);
extern void ring_scan_tables(RbScan *sc, bool latest);
extern char ring_durable_state(RbScan *sc, RbBody *b, RbClaim **claim);

/* ring_relocate.c */
extern void ring_client_truncate(void);

/* ring_enqueue.c */
extern void ring_append_and_publish(int32 queue_id, int n, BodyRow *rows);

/* ring_outcome.c */
extern int	ring_close_claims(int n, const int64 *ids, const int64 *toks, bool *found, bool *ok,
							  RingFlight *fl, TimestampTz lease_before);
extern void ring_require_for_jobs(int n, const int64 *ids);
extern void ring_history_one(const BodyRow *b, char state, int32 attempt, int64 token,
							 const char *worker, Datum last_error, TimestampTz now);
extern void ring_closed_body(const RingFlight *f, BodyRow *b, char **worker);

/* ring_standby.c */
extern bool ring_standby_job(int64 id, char *state, TimestampTz *lease, char **worker,
							 bool *cancel, BodyRow *b);
extern HTAB *ring_standby_scan(void);
extern bool ring_standby_counts(int32 queue_id, int64 *ready, int64 *running,
								TimestampTz *oldest);

#endif							/* PGJQ_RING_STORE_INTERNAL_H */
