/*-------------------------------------------------------------------------
 *
 * guard.h
 *	  Which node serves a call: the hooks a cluster mode sets (src/citus/).
 *
 * On a single server nothing is set and every check is one test of a NULL
 * pointer.  Under Citus (src/citus/ownership.c) a queue is served by the
 * node that holds its routing shard, and an id by the node that issued it
 * (or holds its job); a call that reached another node is refused there,
 * naming the node that serves it, instead of running on this node's
 * (empty) copy.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_API_GUARD_H
#define PGJQ_API_GUARD_H

#include "common/pgjq_common.h"

/*
 * What a queue-first call does with its queue.  Under Citus each kind is
 * served where the queue lives; on the source of a move (a fence on the
 * queue's routing shard, src/citus/moves.c) until the switch:
 *   ADD, CREATE, ALTER  refused (PJ002, retryable): the target's copy was
 *                       made from the source's settings when the move began,
 *                       and the move drains the source before the switch
 *   CLAIM               served in the fence's first phase, refused in its
 *                       last one
 *   CYCLE               as CLAIM, but the last phase serves it with nothing
 *                       to hand out (complete_and_claim keeps its outcomes)
 *   USE                 served
 * and after the switch none of them: ALTER and USE PJ001 (naming the node
 * that serves the queue now), the others PJ002 until the move drops the
 * fence (a coordinator may have delegated them on the metadata of a moment
 * before), PJ001 after.  UNSCHEDULE (a schedule of the queue removed) is refused
 * only there, before the switch (PJ002), and served everywhere else: a
 * schedule lives on the node where it was made, and one whose queue is
 * gone or served elsewhere must stay removable.
 */
typedef enum PgjqGuardCall
{
	PGJQ_GUARD_CREATE,			/* create_queue: the queue is made here */
	PGJQ_GUARD_ADD,				/* enqueue, redrive: adds jobs */
	PGJQ_GUARD_CLAIM,			/* claims: hand jobs out */
	PGJQ_GUARD_CYCLE,			/* complete_and_claim's claim */
	PGJQ_GUARD_ALTER,			/* changes the queue: alter_queue, pause,
								 * resume, purge, drop_queue, hold_key,
								 * release_key, schedule */
	PGJQ_GUARD_USE,				/* uses what it holds: outcomes by queue
								 * (cancel_key, the _in forms), metrics(queue) */
	PGJQ_GUARD_UNSCHEDULE		/* unschedule: a schedule of the queue goes */
} PgjqGuardCall;

/*
 * The queue hook errors unless this node serves the call; it returns false
 * only for a CYCLE call that is served with nothing to claim.  For an
 * ALTER or UNSCHEDULE call it first takes the queue-name lock in shared
 * mode (as enqueues and claims take it before their check), so that a
 * move's fence, which takes it exclusively, waits for the change and then
 * copies it.
 */
typedef bool (*PgjqQueueGuardHook) (const char *queue, PgjqGuardCall call);
typedef void (*PgjqIdsGuardHook) (const int64 *ids, int n);

extern PGDLLIMPORT PgjqQueueGuardHook pgjq_queue_guard_hook;
extern PGDLLIMPORT PgjqIdsGuardHook pgjq_ids_guard_hook;

/* Whether a cluster mode guards calls (false: a single server). */
static inline bool
pgjq_guard_active(void)
{
	return pgjq_queue_guard_hook != NULL;
}

/* Errors unless this node serves the queue for this kind of call. */
static inline void
pgjq_guard_queue(const char *queue, PgjqGuardCall call)
{
	if (pgjq_queue_guard_hook)
		(void) pgjq_queue_guard_hook(queue, call);
}

/*
 * The same for a claim (PGJQ_GUARD_CLAIM or PGJQ_GUARD_CYCLE); false: served,
 * but no job of the queue may be handed out now.
 */
static inline bool
pgjq_guard_claim(const char *queue, PgjqGuardCall call)
{
	return pgjq_queue_guard_hook == NULL || pgjq_queue_guard_hook(queue, call);
}

/*
 * Errors unless this node issued every one of the job ids, or holds their
 * jobs (a move carries jobs with their ids).
 */
static inline void
pgjq_guard_ids(const int64 *ids, int n)
{
	if (pgjq_ids_guard_hook)
		pgjq_ids_guard_hook(ids, n);
}

/* The same for an array's int8 Datums (NULL elements are checked later). */
extern void pgjq_guard_id_datums(const Datum *ids, int n);

#endif							/* PGJQ_API_GUARD_H */
