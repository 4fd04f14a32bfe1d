/*-------------------------------------------------------------------------
 *
 * wait_events.c
 *	  Named wait events, so pg_stat_activity tells a claim waiting for a job
 *	  from wait_jobs() and from pgjq's worker and launcher sleeping.
 *
 * Where the server supports custom wait events (pg_compat.h), each name is
 * registered in the server's shared table at its first use in a process and
 * its id kept for the process's life; where it does not, every sleep is
 * the one event "Extension" of class "Extension", as before.
 *
 *-------------------------------------------------------------------------
 */
#include "common/wait_events.h"

#include "utils/wait_event.h"

#ifdef PGJQ_HAVE_CUSTOM_WAIT_EVENTS
static const char *const event_names[PGJQ_WAIT_EVENT_COUNT] = {
	[PGJQ_WAIT_CLAIM] = "PgjqClaim",
	[PGJQ_WAIT_JOBS] = "PgjqWaitJobs",
	[PGJQ_WAIT_WORKER] = "PgjqWorkerMain",
	[PGJQ_WAIT_LAUNCHER] = "PgjqLauncherMain",
};

/* 0: not registered yet in this process (no custom event has id 0) */
static uint32 event_ids[PGJQ_WAIT_EVENT_COUNT];
#endif

uint32
pgjq_wait_event(PgjqWaitEvent event)
{
	Assert(event >= 0 && event < PGJQ_WAIT_EVENT_COUNT);
#ifdef PGJQ_HAVE_CUSTOM_WAIT_EVENTS
	if (event_ids[event] == 0)
		event_ids[event] = WaitEventExtensionNew(event_names[event]);
	return event_ids[event];
#else
	return PG_WAIT_EXTENSION;
#endif
}
