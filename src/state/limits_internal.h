/*-------------------------------------------------------------------------
 *
 * limits_internal.h
 *	  The limit counters' shared memory and transaction-local state, shared
 *	  by limits.c (owner), limits_claim.c and limits_verify.c.
 *
 * Locking rules: limits_shared->lock (one LWLock) guards the counters hash
 * (limits_counters) and the database table; it is held only for a few hash
 * operations, never across SQL, catalog access or anything that can raise
 * (limits_counter_or_error releases it before it raises).  A caller makes
 * room for its pending ops (limits_pending_room) before taking it.  When the
 * ring's lock is held too, the ring's is taken first.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_LIMITS_INTERNAL_H
#define PGJQ_LIMITS_INTERNAL_H

#include "common/queue_types.h"
#include "state/limits.h"

#include "storage/lwlock.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

typedef struct CounterKey
{
	Oid			dboid;
	int32		queue_id;
	uint64		keyhash;		/* 0: the queue itself */
} CounterKey;

typedef struct Counter
{
	CounterKey	key;
	int32		running;
	int32		untracked;		/* queue entry: open changes of untracked keys */
	uint64		untracked_ends; /* queue entry: transactions with such changes
								 * that ended */
	int64		held_back;		/* queue entry: claims cut short by a limit */
	double		tokens;			/* queue entry: rate bucket */
	TimestampTz refilled;
	bool		limited;		/* queue entry: has a concurrency limit */
	bool		keys_valid;		/* queue entry: its key entries are exact */
} Counter;

typedef struct DbState
{
	Oid			dboid;			/* InvalidOid: free slot */
	Oid			incarnation;	/* OID of pgjq.job when counted; InvalidOid
								 * while (re)counting */
} DbState;

typedef struct LimitsShared
{
	LWLock	   *lock;
	int			ndbs;
	DbState		dbs[FLEXIBLE_ARRAY_MEMBER];
} LimitsShared;

/* A pending change of this backend's open transaction (limits.c) */
typedef enum PendingKind
{
	OP_COUNT,					/* delta >0: applied reservation; <0: at
								 * commit */
	OP_UNTRACKED,				/* delta: the queue's untracked, until the end */
	OP_DROP_QUEUE				/* at commit: forget the queue's entries */
} PendingKind;

/* Why this database's counters are not kept (limits_untracked_why) */
typedef enum UntrackedWhy
{
	UNTRACKED_RECOVERY,
	UNTRACKED_NO_SLOT,
	UNTRACKED_FULL
} UntrackedWhy;

/* limits.c: the shared memory */
extern LimitsShared *limits_shared;
extern HTAB *limits_counters;

/* limits.c: this call's tracking (set by limits_ensure_counted) */
extern Oid	limits_pending_incarnation;
extern UntrackedWhy limits_untracked_why;
extern bool limits_ensure_counted(void);
extern void limits_untracked_error(void);

/* limits.c: the entries; caller holds the lock (exclusively to change) */
extern Counter *limits_counter(int32 queue_id, uint64 keyhash, bool create);
extern Counter *limits_counter_or_error(int32 queue_id, uint64 keyhash, bool may_gc);
extern void limits_counters_full_error(void);
extern void limits_drop_if_idle(Counter *c);

/* limits.c: this transaction's pending changes */
extern void limits_pending_room(int n);
extern bool limits_pending_full(void);
extern void limits_add_pending(int32 queue_id, uint64 keyhash, int32 delta, PendingKind kind);
extern void limits_shrink_reservation(int32 queue_id, uint64 keyhash, int32 n);
extern int32 limits_own_ends(int32 queue_id, uint64 keyhash);

/* A fair key's counter hash (pgjq_limits_key_hash of the whole string). */
static inline uint64
limits_fair_key_hash(const char *fair_key)
{
	return pgjq_limits_key_hash(fair_key, strlen(fair_key));
}

/* True when this call's counter changes count (see limits_ensure_counted). */
static inline bool
limits_tracking(void)
{
	return OidIsValid(limits_pending_incarnation);
}

#endif							/* PGJQ_LIMITS_INTERNAL_H */
