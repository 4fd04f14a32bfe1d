/*-------------------------------------------------------------------------
 *
 * citus_mode.h
 *	  Whether this database runs pgjq on a Citus cluster, and what this
 *	  node is in it.
 *
 * Citus mode is on in a database where Citus is preloaded and
 * pgjq.citus_setup() has made pgjq.queue_route, the distributed table whose
 * shards decide which node serves a queue.  Everything here is cached per
 * backend and dropped when the routing table's metadata changes (a relcache
 * invalidation of pgjq.queue_route: Citus sends one when a shard moves, and
 * pgjq's own fencing sends one).  Without Citus nothing here runs a query.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_CITUS_MODE_H
#define PGJQ_CITUS_MODE_H

#include "common/pgjq_common.h"

/* SQLSTATEs of the Citus mode (README, "Beyond one server") */
#define PGJQ_ERRCODE_WRONG_NODE		MAKE_SQLSTATE('P','J','0','0','1')
#define PGJQ_ERRCODE_QUEUE_MOVING	MAKE_SQLSTATE('P','J','0','0','2')

/* ids and tokens of node group g are (g + 1) << 48 | n (n < 2^48) */
#define PGJQ_CITUS_ID_SHIFT 48

/*
 * the Citus major version pgjq's Citus mode is built and tested for:
 * PGJQ_CITUS_MAJOR, by PostgreSQL version (common/pg_compat.h)
 */

extern bool pgjq_citus_preloaded(void);
extern bool pgjq_citus_mode(void);
extern int32 pgjq_citus_local_group(void);
extern Oid	pgjq_citus_route_rel(void);
extern uint64 pgjq_citus_generation(void);
extern void pgjq_citus_node_of_group(int32 group, char **host, int32 *port);
extern void pgjq_citus_note_write(void);
extern void pgjq_citus_require_id_range(void);

/* the node group an id or token names; -1: one from before citus_setup() */
static inline int32
pgjq_citus_group_of_id(int64 id)
{
	return id < ((int64) 1 << PGJQ_CITUS_ID_SHIFT) ? -1 :
		(int32) (id >> PGJQ_CITUS_ID_SHIFT) - 1;
}

#endif							/* PGJQ_CITUS_MODE_H */
