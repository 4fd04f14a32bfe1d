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

/* the next time a schedule is due (DT_NOEND: none) */
extern TimestampTz pgjq_schedule_next_slot(void);

#endif							/* PGJQ_SCHEDULE_H */
