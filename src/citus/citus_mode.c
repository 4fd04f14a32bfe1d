/*-------------------------------------------------------------------------
 *
 * citus_mode.c
 *	  Citus mode: detection, this node's group, and Citus's two-phase
 *	  commit for pgjq's local writes.
 *
 * pgjq never links against Citus: what it needs from Citus's metadata it
 * reads with SQL (pg_dist_local_group, pg_dist_node), and the one C symbol
 * it calls, Use2PCForCoordinatedTransaction, is looked up in the already
 * loaded citus.so (by the name shared_preload_libraries gives it, so the
 * very file Citus was loaded from), only where Citus is in that list and
 * exports it (Citus 13 on PostgreSQL 15; Citus 14 exports no C function, and
 * pgjq asks for two-phase commit through SQL: pgjq_citus_note_write).  The
 * mode is refused with a Citus of another major version than the one pgjq
 * is built and tested for with this PostgreSQL (the symbol's contract, and
 * the metadata read, are that Citus's: PGJQ_CITUS_MAJOR in pg_compat.h).
 *
 * A node in Citus mode issues ids and tokens in its group's range (set by
 * citus_setup() through _citus_node_setup()): an id names the node that
 * holds its job.  The guard refuses to serve on a node whose id sequence is
 * outside that range (a node added without citus_setup(), a sequence reset
 * by hand), checked once per backend until it passes.
 *
 *-------------------------------------------------------------------------
 */
#include "citus/citus_mode.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/varlena.h"

/* per backend; known = false makes the next call look again */
static bool citus_loaded_known = false;
static bool citus_loaded = false;
static bool mode_known = false;
static bool mode_on = false;
static Oid	route_rel = InvalidOid;
static Oid	fence_rel = InvalidOid;
static int32 local_group = -1;
static bool callback_registered = false;
static bool id_range_ok = false;

/* the shared_preload_libraries entry Citus was loaded by */
static char citus_library[MAXPGPATH];

typedef void (*Use2PCFunc) (void);
static Use2PCFunc use_2pc = NULL;
static bool use_2pc_looked_up = false;

/* no Use2PCForCoordinatedTransaction: ask at pre-commit (ask_2pc_by_sql) */
static bool write_noted = false;
static bool precommit_registered = false;

static void ask_2pc_at_pre_commit(XactEvent event, void *arg);
static void ask_2pc_by_sql(void);

/* bumped whenever the above is dropped: ownership.c's caches follow it */
static uint64 generation = 1;

static void
forget(void)
{
	mode_known = false;
	generation++;
}

uint64
pgjq_citus_generation(void)
{
	return generation;
}

/*
 * A relcache invalidation of the routing table (Citus's on a placement
 * change, pgjq's own when it fences a shard) or of everything; while the
 * mode is off, any relation's: pgjq.queue_route may just have been created.
 */
static void
relcache_callback(Datum arg, Oid relid)
{
	if (!mode_on || relid == InvalidOid || relid == route_rel || relid == fence_rel)
		forget();
}

/* Is citus in shared_preload_libraries (and so loaded in this process)? */
bool
pgjq_citus_preloaded(void)
{
	if (!citus_loaded_known)
	{
		const char *libs = GetConfigOption("shared_preload_libraries", true, false);
		char	   *copy;
		List	   *names;
		ListCell   *lc;

		citus_loaded = false;
		if (libs)
		{
			copy = pstrdup(libs);
			if (SplitDirectoriesString(copy, ',', &names))
				foreach(lc, names)
			{
				const char *name = lfirst(lc);
				const char *base = strrchr(name, '/');

				base = base ? base + 1 : name;
				if (strcmp(base, "citus") == 0 || strcmp(base, "citus.so") == 0)
				{
					citus_loaded = true;
					strlcpy(citus_library, name, sizeof(citus_library));
				}
			}
		}
		citus_loaded_known = true;
	}
	return citus_loaded;
}

static void
look(void)
{
	Oid			nsp;

	mode_on = false;
	route_rel = InvalidOid;
	fence_rel = InvalidOid;
	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(relcache_callback, (Datum) 0);
		callback_registered = true;
	}
	nsp = get_namespace_oid("pgjq", true);
	if (OidIsValid(nsp))
	{
		route_rel = get_relname_relid("queue_route", nsp);
		fence_rel = get_relname_relid("queue_fence", nsp);
	}
	if (OidIsValid(route_rel))
	{
		bool		isnull;

		if (SPI_connect() != SPI_OK_CONNECT)
			elog(ERROR, "pgjq: SPI_connect failed");
		if (SPI_execute("SELECT groupid FROM pg_catalog.pg_dist_local_group", true, 1) != SPI_OK_SELECT ||
			SPI_processed != 1)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("pgjq.queue_route exists but this node has no Citus group"),
					 errhint("Run pgjq.citus_setup() on the coordinator.")));
		local_group = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
		if (SPI_execute("SELECT extversion FROM pg_catalog.pg_extension"
						" WHERE extname OPERATOR(pg_catalog.=) 'citus'", true, 1) != SPI_OK_SELECT)
			elog(ERROR, "pgjq: could not read the version of Citus");
		if (SPI_processed == 1)
		{
			char	   *version = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

			if (version == NULL || atoi(version) != PGJQ_CITUS_MAJOR)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("pgjq's Citus mode needs Citus %d, this node has Citus %s",
								PGJQ_CITUS_MAJOR, version ? version : "(unknown)"),
						 errdetail("pgjq calls into Citus and reads its metadata as Citus %d "
								   "does; it is not tested with another major version.",
								   PGJQ_CITUS_MAJOR),
						 errhint("Install Citus %d.x on every node.", PGJQ_CITUS_MAJOR)));
		}
		SPI_finish();
		mode_on = true;
	}
	mode_known = true;
}

/*
 * Whether this database is in Citus mode.  The first call of a backend (and
 * the first after an invalidation) looks; the others test two booleans.
 * Background workers are never guarded: pgjq's own worker serves this
 * node's queues.
 */
bool
pgjq_citus_mode(void)
{
	if (!pgjq_citus_preloaded())
		return false;
	if (!mode_known)
		look();
	return mode_on;
}

int32
pgjq_citus_local_group(void)
{
	(void) pgjq_citus_mode();
	return local_group;
}

Oid
pgjq_citus_route_rel(void)
{
	(void) pgjq_citus_mode();
	return route_rel;
}

/*
 * Errors unless this node's job id sequence is in its group's range (the
 * guard's first step in Citus mode).  Checked by each backend until it
 * passes, then not again: the range, once set, is kept by the sequence's
 * MAXVALUE.  Without it (a node added after citus_setup() without running
 * it again, a sequence reset by hand) the node would issue ids below 2^48,
 * which name no node: the id guard of every node would serve them.
 */
void
pgjq_citus_require_id_range(void)
{
	int64		last = 0;
	int64		lo;
	int64		hi;
	int32		group;
	bool		isnull;

	if (id_range_ok)
		return;
	group = pgjq_citus_local_group();
	lo = ((int64) group + 1) << PGJQ_CITUS_ID_SHIFT;
	hi = lo + (((int64) 1 << PGJQ_CITUS_ID_SHIFT) - 1);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (SPI_execute("SELECT last_value FROM pgjq.job_id_seq", true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "pgjq: could not read pgjq.job_id_seq");
	last = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	if (group < 0 || last < lo || last > hi)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this node's job ids are not in the range of its node group"),
				 errdetail("pgjq.job_id_seq is at %lld; under Citus node group %d issues ids "
						   "from %lld to %lld, so that an id names the node that holds its job.",
						   (long long) last, group, (long long) lo, (long long) hi),
				 errhint("Run SELECT pgjq.citus_setup() on the coordinator (again after adding "
						 "a node).")));
	id_range_ok = true;
}

/* host and port of the primary of a node group (for error messages) */
void
pgjq_citus_node_of_group(int32 group, char **host, int32 *port)
{
	Oid			types[1] = {INT4OID};
	Datum		values[1] = {Int32GetDatum(group)};

	*host = psprintf("(node group %d)", group);
	*port = 0;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (SPI_execute_with_args("SELECT nodename, nodeport FROM pg_catalog.pg_dist_node"
							  " WHERE groupid OPERATOR(pg_catalog.=) $1"
							  "   AND noderole OPERATOR(pg_catalog.=) 'primary'"
							  " ORDER BY isactive DESC LIMIT 1",
							  1, types, values, NULL, true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		bool		isnull;
		MemoryContext spi = MemoryContextSwitchTo(CurTransactionContext);

		*host = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		*port = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
		MemoryContextSwitchTo(spi);
	}
	SPI_finish();
}

/*
 * pgjq writes this node's tables from C, which Citus does not see: in a
 * transaction that also writes another node (through Citus), Citus would
 * commit that node with a plain COMMIT before this one's commit record, and
 * a crash in between would keep the remote write and lose pgjq's.  Telling
 * Citus to use two-phase commit makes it PREPARE the remote participants
 * first and let this node's commit decide.  Called at the start of every
 * pgjq call that touches storage (the engine's storage_begin hook), only
 * where Citus is loaded; Citus resets the flag at the end of each
 * transaction, and it costs nothing where no remote node was written.
 *
 * Citus 13 built for PostgreSQL 15 exports Use2PCForCoordinatedTransaction,
 * which pgjq calls.  Built for PostgreSQL 16 and later, extensions hide every
 * symbol they do not mark for export (PGXS's -fvisibility=hidden), and
 * Citus 14 marks none of its C functions: there pgjq asks through SQL, at
 * pre-commit (ask_2pc_by_sql).
 */
void
pgjq_citus_note_write(void)
{
	if (!pgjq_citus_preloaded())
		return;
	if (!use_2pc_looked_up)
	{
		use_2pc = (Use2PCFunc) load_external_function(citus_library,
													  "Use2PCForCoordinatedTransaction",
													  false, NULL);
		use_2pc_looked_up = true;
	}
	if (use_2pc != NULL)
	{
		use_2pc();
		return;
	}
	if (!precommit_registered)
	{
		/*
		 * registered after Citus's own callback, so called before it: Citus
		 * reads the flag in its pre-commit
		 */
		RegisterXactCallback(ask_2pc_at_pre_commit, NULL);
		precommit_registered = true;
	}
	write_noted = true;
}

/*
 * Citus sets its two-phase flag whenever it executes a modification on a
 * local shard (its local executor).  pgjq.queue_route has no rows and a
 * shard on every node that serves queues: a DELETE of the name of a queue
 * this node serves goes to the local shard, deletes nothing (no WAL, no
 * dead tuple) and sets the flag.  Done only where this node coordinates
 * the transaction with other nodes (a distributed transaction number that
 * this node's group issued: not in a call another node delegated here,
 * where Citus refuses a distributed query inside a shard's), as the table's
 * owner (the caller may not write it), names qualified.  A
 * node that holds no queue has nothing of pgjq's to lose.
 */
static void
ask_2pc_by_sql(void)
{
	Oid			nsp = get_namespace_oid("pgjq", true);
	Oid			rel = OidIsValid(nsp) ? get_relname_relid("queue_route", nsp) : InvalidOid;
	Oid			save_user;
	int			save_sec;
	HeapTuple	tup;
	Oid			owner;

	if (!OidIsValid(rel))
		return;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(rel));
	if (!HeapTupleIsValid(tup))
		return;
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);

	GetUserIdAndSecContext(&save_user, &save_sec);
	SetUserIdAndSecContext(owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	/* at pre-commit no statement's snapshot is active */
	PushActiveSnapshot(GetTransactionSnapshot());
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "pgjq: SPI_connect failed");
	if (SPI_execute("SELECT t.transaction_number OPERATOR(pg_catalog.<>) 0"
					"   AND t.initiator_node_identifier OPERATOR(pg_catalog.=) g.groupid"
					"  FROM pg_catalog.get_current_transaction_id() t, pg_catalog.pg_dist_local_group g",
					true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		bool		isnull;
		bool		coordinated = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc, 1, &isnull));

		if (coordinated && !isnull &&
			SPI_execute("SELECT name FROM pgjq.queue LIMIT 1", true, 1) == SPI_OK_SELECT &&
			SPI_processed == 1)
		{
			Oid			types[1] = {TEXTOID};
			Datum		values[1];

			values[0] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
			if (!isnull &&
				SPI_execute_with_args("DELETE FROM pgjq.queue_route"
									  " WHERE queue OPERATOR(pg_catalog.=) $1",
									  1, types, values, NULL, false, 0) != SPI_OK_DELETE)
				elog(ERROR, "pgjq: could not ask Citus for two-phase commit");
		}
	}
	SPI_finish();
	PopActiveSnapshot();
	SetUserIdAndSecContext(save_user, save_sec);
}

static void
ask_2pc_at_pre_commit(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT && write_noted)
	{
		write_noted = false;
		ask_2pc_by_sql();
	}
	else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_COMMIT ||
			 event == XACT_EVENT_PREPARE || event == XACT_EVENT_PARALLEL_ABORT)
		write_noted = false;
}
