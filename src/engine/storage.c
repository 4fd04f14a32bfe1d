/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Entry and exit of the storage engine, and helpers its files share.
 *
 * pgjq_storage_begin() checks that the schema is one this library serves,
 * connects to SPI and remembers the caller's memory
 * context, where the engine copies every result it hands back.  Before
 * that it calls the begin hook (limits.c's counter rebuild), so the hook
 * runs before any statement of the call.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/engine.h"
#include "engine/storage_internal.h"

#include "catalog/namespace.h"
#include "utils/lsyscache.h"

MemoryContext pgjq_result_cxt = NULL;
PgjqLeftRunningHook pgjq_left_running_hook = NULL;
PgjqBecameReadyHook pgjq_became_ready_hook = NULL;
PgjqJobsFinishedHook pgjq_jobs_finished_hook = NULL;
PgjqStorageBeginHook pgjq_storage_begin_hook = NULL;

/*
 * Whether this database's pgjq schema is one this library serves: 0.2.0
 * added the ring's tables.  A 0.1.0 schema (the library updated, ALTER
 * EXTENSION UPDATE not run yet) is refused with a hint before anything
 * changes; its jobs wait safely until the update adopts them.
 */
bool
pgjq_storage_schema_current(void)
{
	Oid			nsp = get_namespace_oid("pgjq", true);

	return OidIsValid(nsp) && OidIsValid(get_relname_relid("ring_body_0", nsp));
}

void
pgjq_storage_require_schema(void)
{
	if (!pgjq_storage_schema_current())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("pgjq's schema in this database is older than its library (%s)", PGJQ_VERSION),
				 errhint("Update it: ALTER EXTENSION pgjq UPDATE.")));
}

void
pgjq_storage_begin(void)
{
	MemoryContext caller = CurrentMemoryContext;

	pgjq_storage_require_schema();
	if (pgjq_storage_begin_hook)
		pgjq_storage_begin_hook();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	pgjq_result_cxt = caller;
}

void
pgjq_storage_end(void)
{
	SPI_finish();
}

/* An interval Datum of exactly us microseconds. */
Datum
pgjq_interval_datum(int64 us)
{
	Interval   *iv = palloc0(sizeof(Interval));

	iv->time = us;
	return IntervalPGetDatum(iv);
}

/* The OID of schema pgjq; errors if the extension is not installed. */
Oid
pgjq_namespace(void)
{
	return get_namespace_oid("pgjq", false);
}

/* The OID of relation pgjq.<name>, or InvalidOid. */
Oid
pgjq_relation(const char *name)
{
	return get_relname_relid(name, pgjq_namespace());
}
