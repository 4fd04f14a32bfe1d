/*-------------------------------------------------------------------------
 *
 * guc.h
 *	  pgjq's settings (guc.c defines and registers them, with their
 *	  documentation; the test-only crash settings are in crash_points.h).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_GUC_H
#define PGJQ_GUC_H

#include "common/pgjq_common.h"

extern char *pgjq_database_names;
extern int	pgjq_max_payload_size;
extern int	pgjq_max_sleep_ms;
extern int	pgjq_debug_worker_step_ms;
extern int	pgjq_prune_interval_ms;
extern int	pgjq_max_tracked_keys;
extern int	pgjq_max_databases;
extern int	pgjq_max_wait_ms;
extern int	pgjq_horizon_warn_after_s;
extern int	pgjq_max_metrics_queues;
extern int	pgjq_max_metrics_claims;

/* the ring engine's shared-memory bounds and its slot size */
extern int	pgjq_ring_positions;
extern int	pgjq_ring_max_in_flight;
extern int	pgjq_ring_max_lanes;
extern int	pgjq_ring_max_holds;
extern int	pgjq_ring_max_rate_keys;
extern int	pgjq_ring_max_queues;
extern int	pgjq_ring_slot_rows;

extern void pgjq_guc_init(void);

#endif							/* PGJQ_GUC_H */
