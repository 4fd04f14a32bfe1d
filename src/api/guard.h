/*-------------------------------------------------------------------------
 *
 * guard.h
 *	  Which node serves a call: the hooks a cluster mode sets (src/citus/).
 *
 * On a single server nothing is set and every check is one test of a NULL
 * pointer.  Under Citus (src/citus/ownership.c) a queue is served by the
 * node that holds its routing shard, and an id by the node that issued it;
 * a call that reached another node is refused there, naming the node that
 * serves it, instead of running on this node's (empty) copy.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_API_GUARD_H
#define PGJQ_API_GUARD_H

#include "common/pgjq_common.h"

/* what a queue-first call does with its queue */
typedef enum PgjqGuardCall
{
	PGJQ_GUARD_CREATE,			/* create_queue: the queue is made here */
	PGJQ_GUARD_ADD,				/* enqueue, redrive: adds jobs */
	PGJQ_GUARD_CLAIM,			/* claims: hand jobs out */
	PGJQ_GUARD_USE				/* everything else: outcomes, admin */
} PgjqGuardCall;

typedef void (*PgjqQueueGuardHook) (const char *queue, PgjqGuardCall call);
typedef void (*PgjqIdsGuardHook) (const int64 *ids, int n);

extern PGDLLIMPORT PgjqQueueGuardHook pgjq_queue_guard_hook;
extern PGDLLIMPORT PgjqIdsGuardHook pgjq_ids_guard_hook;

/* Errors unless this node serves the queue for this kind of call. */
static inline void
pgjq_guard_queue(const char *queue, PgjqGuardCall call)
{
	if (pgjq_queue_guard_hook)
		pgjq_queue_guard_hook(queue, call);
}

/* Errors unless this node issued every one of the job ids. */
static inline void
pgjq_guard_ids(const int64 *ids, int n)
{
	if (pgjq_ids_guard_hook)
		pgjq_ids_guard_hook(ids, n);
}

/* The same for an array's int8 Datums (NULL elements are checked later). */
extern void pgjq_guard_id_datums(const Datum *ids, int n);

#endif							/* PGJQ_API_GUARD_H */
