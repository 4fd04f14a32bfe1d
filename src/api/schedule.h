/*-------------------------------------------------------------------------
 *
 * schedule.h
 *	  Periodic jobs (schedule.c), fired by the background worker.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_SCHEDULE_H
#define PGJQ_SCHEDULE_H

#include "common/pgjq_common.h"

/* enqueue the jobs of the schedules that are due (a chunk of them) */
extern int64 pgjq_schedule_fire_chunk(void);

/*
 * Set by a cluster mode (src/citus/moves.c): true when this node must not
 * fire a schedule of the queue now (its queue is being moved away); the
 * schedule stays due, its slots not skipped, until the hook says false or
 * the move takes the schedule to the queue's new node.
 */
typedef bool (*PgjqScheduleHeldHook) (const char *queue);
extern PGDLLIMPORT PgjqScheduleHeldHook pgjq_schedule_held_hook;

/* the next time a schedule is due (DT_NOEND: none) */
extern TimestampTz pgjq_schedule_next_slot(void);

#endif							/* PGJQ_SCHEDULE_H */
