/*-------------------------------------------------------------------------
 *
 * guard.c
 *	  The hooks of guard.h; src/pgjq.c sets them when a cluster mode is
 *	  built in (src/citus/).
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"

PgjqQueueGuardHook pgjq_queue_guard_hook = NULL;
PgjqIdsGuardHook pgjq_ids_guard_hook = NULL;

void
pgjq_guard_id_datums(const Datum *ids, int n)
{
	int64	   *v;

	if (pgjq_ids_guard_hook == NULL || n == 0)
		return;
	v = palloc(sizeof(int64) * n);
	for (int i = 0; i < n; i++)
		v[i] = DatumGetInt64(ids[i]);
	pgjq_ids_guard_hook(v, n);
	pfree(v);
}
