/*-------------------------------------------------------------------------
 *
 * crash_points.c
 *	  Test-only crash injection: pgjq.debug_crash_at names a point where the
 *	  process kills itself with SIGKILL, as kill -9 would, so that the TAP
 *	  tests can crash at exactly the moments that are hard to hit from
 *	  outside (PostgreSQL 15 has no injection points).
 *
 * Points:
 * - "commit": in pgjq's transaction callbacks at XACT_EVENT_COMMIT, after
 *   the commit record is written and before any of pgjq's shared memory
 *   (limit counters, wake-ups, the worker's deadline) follows the commit.
 *   The first of pgjq's callbacks to run crashes, so none has run.
 * - "worker_chunk": in the background worker, after a rescue or promotion
 *   chunk has committed and before the next one starts.
 * - "worker_reclaim": likewise, after a step of giving the ring's space back
 *   (a truncation or a relocation) has committed.
 * - "ring_relocate": after a relocation wrote its copies and log rows,
 *   before its transaction commits.
 * - "ring_job_live": in job(id) of a ring job (READ COMMITTED, preloaded),
 *   after its body was read with the statement's snapshot and before
 *   shared memory is looked at.
 *
 * pgjq.debug_pause_at names the same points: there the process sleeps
 * PAUSE_MS instead (and goes on), so that a test can act in the window the
 * point marks, e.g. between a commit becoming visible and pgjq's commit
 * callbacks.
 *
 * The settings are superuser-only and empty by default; a point crashes only
 * the process that has the setting when it gets there.  SIGKILL (not
 * abort()) so that the postmaster sees what an operator's kill -9 gives it:
 * no core file, no exit handler, a crash restart.
 *
 *-------------------------------------------------------------------------
 */
#include "common/crash_points.h"
#include "common/pgjq_common.h"
#include "common/guc.h"

#include <signal.h>

#include "miscadmin.h"

char	   *pgjq_debug_crash_at = NULL;
char	   *pgjq_debug_pause_at = NULL;

#define PAUSE_MS	3000

void
pgjq_crash_point(const char *point)
{
	if (pgjq_debug_pause_at != NULL && strcmp(pgjq_debug_pause_at, point) == 0)
	{
		elog(LOG, "pgjq: pausing at point \"%s\" (pgjq.debug_pause_at)", point);
		pg_usleep(PAUSE_MS * 1000L);
	}
	if (pgjq_debug_crash_at == NULL || pgjq_debug_crash_at[0] == '\0' ||
		strcmp(pgjq_debug_crash_at, point) != 0)
		return;
	/* LOG first: the test finds it in the server log */
	elog(LOG, "pgjq: crashing at point \"%s\" (pgjq.debug_crash_at)", point);
	(void) kill(MyProcPid, SIGKILL);
	/* SIGKILL is not delivered late, but do not go on if it were */
	for (;;)
		pause();
}
