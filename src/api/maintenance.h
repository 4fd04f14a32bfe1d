/*-------------------------------------------------------------------------
 *
 * maintenance.h
 *	  The maintenance steps (maintenance.c) the SQL functions and the
 *	  background worker run.
 *
 * Each step runs in the caller's transaction; the SQL functions do a whole
 * backlog, the worker a chunk (PGJQ_MAINTENANCE_CHUNK, or one partition) per
 * transaction.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_MAINTENANCE_H
#define PGJQ_MAINTENANCE_H

#include "common/pgjq_common.h"

extern int64 pgjq_maintenance_promote(void);
extern int64 pgjq_maintenance_rescue(void);
extern int64 pgjq_maintenance_prune(void);
extern int64 pgjq_maintenance_promote_chunk(void);
extern int64 pgjq_maintenance_rescue_chunk(void);
extern int64 pgjq_maintenance_ring_reclaim(int limit);
extern int64 pgjq_maintenance_ring_reclaim_chunk(void);
extern void pgjq_maintenance_prune_prepare(void);
extern int64 pgjq_maintenance_summarize(void);
extern int	pgjq_maintenance_prune_one(int skip, int64 *pruned);
extern TimestampTz pgjq_maintenance_next_deadline(void);

#endif							/* PGJQ_MAINTENANCE_H */
