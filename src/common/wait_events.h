/*-------------------------------------------------------------------------
 *
 * wait_events.h
 *	  The wait events pgjq's processes report while they sleep.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_WAIT_EVENTS_H
#define PGJQ_WAIT_EVENTS_H

#include "common/pgjq_common.h"

typedef enum PgjqWaitEvent
{
	PGJQ_WAIT_CLAIM,			/* a waiting claim: "PgjqClaim" */
	PGJQ_WAIT_JOBS,				/* wait_jobs(): "PgjqWaitJobs" */
	PGJQ_WAIT_WORKER,			/* a database's worker: "PgjqWorkerMain" */
	PGJQ_WAIT_LAUNCHER,			/* the launcher: "PgjqLauncherMain" */
	PGJQ_WAIT_EVENT_COUNT
} PgjqWaitEvent;

/*
 * The wait_event_info to pass to WaitLatch: the event's own name where the
 * server lets extensions name theirs (pg_compat.h), else "Extension".
 */
extern uint32 pgjq_wait_event(PgjqWaitEvent event);

#endif							/* PGJQ_WAIT_EVENTS_H */
