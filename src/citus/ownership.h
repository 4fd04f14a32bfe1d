/*-------------------------------------------------------------------------
 *
 * ownership.h
 *	  Which node serves a queue and an id under Citus: the guard of every
 *	  pgjq call (api/guard.h's hooks).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_CITUS_OWNERSHIP_H
#define PGJQ_CITUS_OWNERSHIP_H

#include "api/guard.h"

extern bool pgjq_citus_guard_queue(const char *queue, PgjqGuardCall call);
extern void pgjq_citus_guard_ids(const int64 *ids, int n);

#endif							/* PGJQ_CITUS_OWNERSHIP_H */
