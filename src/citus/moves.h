/*-------------------------------------------------------------------------
 *
 * moves.h
 *	  pgjq.move_queues()'s steps on a node: the fence of a routing shard.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_CITUS_MOVES_H
#define PGJQ_CITUS_MOVES_H

#include "common/pgjq_common.h"

extern bool pgjq_citus_guard_on;	/* pgjq.citus_guard */
extern int	pgjq_debug_move_stop_after; /* pgjq.debug_move_stop_after */

extern void pgjq_citus_moves_init(void);

#endif							/* PGJQ_CITUS_MOVES_H */
