/*-------------------------------------------------------------------------
 *
 * key_hold.c
 *	  The SQL functions hold_key(queue, fair_key, until) and
 *	  release_key(queue, fair_key): argument checks, then the engine's
 *	  pgjq_key_hold/pgjq_key_release (engine/key_holds.c), which take effect
 *	  when the transaction commits (state/ring_holds.c says how claims skip
 *	  a held key).
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "common/args.h"
#include "engine/engine.h"
#include "state/ring_shmem.h"

#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(pgjq_hold_key);
PG_FUNCTION_INFO_V1(pgjq_release_key);

#define MAX_HOLD_US		(INT64CONST(365) * USECS_PER_DAY)

/* ---------------------------------------------------------------------
 * SQL
 * --------------------------------------------------------------------- */

static char *
fair_key_arg(FunctionCallInfo fcinfo, int argno)
{
	/* NULL: the jobs without a fair key */
	char	   *key = pgjq_arg_text(fcinfo, argno, "fair_key", PGJQ_MAX_KEY);

	return key ? key : "";
}

/* pgjq.hold_key(queue, fair_key, until) */
Datum
pgjq_hold_key(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	char	   *key = fair_key_arg(fcinfo, 1);
	TimestampTz until;
	TimestampTz now = GetCurrentTimestamp();
	PgjqQueue	queue;

	pgjq_arg_not_null(fcinfo, 2, "until");
	until = PG_GETARG_TIMESTAMPTZ(2);
	if (until <= now || until > now + MAX_HOLD_US)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("until must be in the future, at most 365 days from now"),
				 errhint("release_key() ends a hold.")));
	pgjq_ring_require();
	pgjq_storage_begin();
	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_queue_get_or_error(name, &queue);
	pgjq_key_hold(queue.queue_id, key, until);
	pgjq_storage_end();
	PG_RETURN_VOID();
}

/* pgjq.release_key(queue, fair_key): false when the key was not held */
Datum
pgjq_release_key(PG_FUNCTION_ARGS)
{
	char	   *name = pgjq_arg_queue_name(fcinfo, 0);
	char	   *key = fair_key_arg(fcinfo, 1);
	PgjqQueue	queue;
	bool		released;

	pgjq_ring_require();
	pgjq_storage_begin();
	pgjq_guard_queue(name, PGJQ_GUARD_ALTER);
	pgjq_storage_queue_get_or_error(name, &queue);
	released = pgjq_key_release(queue.queue_id, key);
	pgjq_storage_end();
	PG_RETURN_BOOL(released);
}
