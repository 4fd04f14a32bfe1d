/*-------------------------------------------------------------------------
 *
 * limits_verify.c
 *	  The limit counters as SQL sees them: pgjq.verify()'s comparison of
 *	  this database's counters with its running jobs (pgjq_limits_verify),
 *	  pgjq._limits() (the queue counters, for queue_stats) and
 *	  pgjq._preloaded().
 *
 * Order of operations of pgjq_limits_verify: make sure the database is
 * counted (limits_ensure_counted, limits.c), copy this database's counter
 * entries, release the lock, then read the running jobs per (queue, key
 * hash) (the running_keys hook: the ring), sum them per queue and per key
 * (add_expected) and compare: a queue's count always, a key's only when the
 * queue's keys are tracked and no untracked change of it is open.
 *
 * Locking: limits_shared->lock, shared, only while the entries are copied or
 * scanned; never across the read of the running jobs.
 *
 *-------------------------------------------------------------------------
 */
#include "state/limits_verify.h"
#include "state/limits_internal.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"

PG_FUNCTION_INFO_V1(pgjq_limits);
PG_FUNCTION_INFO_V1(pgjq_preloaded);

/* pgjq._preloaded(): whether the shared-memory features are available. */
Datum
pgjq_preloaded(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(limits_shared != NULL);
}

/* pgjq._limits(): this database's queue counters, for queue_stats. */
Datum
pgjq_limits(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HASH_SEQ_STATUS scan;
	Counter    *c;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext old;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "pgjq: _limits() must return a record");
	old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTupleDescCopy(tupdesc);
	store = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(old);
	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;
	if (limits_shared == NULL)
		return (Datum) 0;

	LWLockAcquire(limits_shared->lock, LW_SHARED);
	hash_seq_init(&scan, limits_counters);
	while ((c = hash_seq_search(&scan)) != NULL)
	{
		Datum		values[3];
		bool		nulls[3] = {0};

		if (c->key.dboid != MyDatabaseId || c->key.keyhash != 0)
			continue;
		values[0] = Int32GetDatum(c->key.queue_id);
		values[1] = Int32GetDatum(c->running);
		values[2] = Int64GetDatum(c->held_back);
		tuplestore_putvalues(store, tupdesc, values, nulls);
	}
	LWLockRelease(limits_shared->lock);
	return (Datum) 0;
}

/* verify(): running jobs expected per (queue, key), summed over sources */
typedef struct Expected
{
	int32		queue_id;
	uint64		keyhash;		/* 0: the queue */
	char	   *name;			/* the key, if known (the ring has hashes
								 * only) */
	int32		count;
} Expected;

static void
add_expected(Expected **exp, int *n, int *max, int32 queue_id, uint64 keyhash, char *name,
			 int32 count)
{
	for (int i = 0; i < *n; i++)
		if ((*exp)[i].queue_id == queue_id && (*exp)[i].keyhash == keyhash)
		{
			(*exp)[i].count += count;
			if ((*exp)[i].name == NULL)
				(*exp)[i].name = name;
			return;
		}
	if (*n == *max)
	{
		*max = *max == 0 ? 64 : *max * 2;
		*exp = *exp == NULL ? palloc(sizeof(Expected) * *max) :
			repalloc(*exp, sizeof(Expected) * *max);
	}
	(*exp)[*n].queue_id = queue_id;
	(*exp)[*n].keyhash = keyhash;
	(*exp)[*n].name = name;
	(*exp)[*n].count = count;
	(*n)++;
}

/*
 * verify(): compare this database's counters with the running jobs in
 * pgjq.job, read in the caller's SPI connection with a new snapshot.  Each
 * difference goes into *diffs (palloc'd); returns how many.  A queue whose
 * untracked changes are open is skipped (its key entries are not exact by
 * design until they end).  Nothing is compared before the database is
 * counted (the first pgjq call counts it) or without the preload.  Open
 * transactions that claimed or finished jobs show as differences until they
 * end: verify() reads again before it reports one.
 */
int
pgjq_limits_verify(PgjqLimitsDiff **diffs)
{
	typedef struct Entry
	{
		int32		queue_id;
		uint64		keyhash;
		int32		running;
		bool		keys_valid;
		bool		skip;
		int32		expected;
	} Entry;
	Entry	   *entries;
	int			nentries = 0;
	int			maxentries;
	int			ndiffs = 0;
	HASH_SEQ_STATUS scan;
	Counter    *c;
	int			nrk;
	int32	   *rk_qids;
	uint64	   *rk_hashes;
	int64	   *rk_counts;
	Expected   *exp = NULL;
	int			nexp = 0,
				maxexp = 0;

	*diffs = NULL;
	if (limits_shared == NULL || !limits_ensure_counted())
		return 0;
	LWLockAcquire(limits_shared->lock, LW_SHARED);
	maxentries = hash_get_num_entries(limits_counters) + 1;
	entries = palloc(sizeof(Entry) * maxentries);
	hash_seq_init(&scan, limits_counters);
	while ((c = hash_seq_search(&scan)) != NULL)
	{
		if (c->key.dboid != MyDatabaseId)
			continue;
		entries[nentries].queue_id = c->key.queue_id;
		entries[nentries].keyhash = c->key.keyhash;
		entries[nentries].running = c->running;
		entries[nentries].keys_valid = c->keys_valid;
		entries[nentries].skip = c->untracked > 0;
		entries[nentries].expected = 0;
		nentries++;
	}
	LWLockRelease(limits_shared->lock);

	/*
	 * the ring's (queue, key) pairs and the entries: room for every
	 * difference
	 */
	nrk = pgjq_limits_running_keys_hook(0, &rk_qids, &rk_hashes, &rk_counts);
	*diffs = palloc(sizeof(PgjqLimitsDiff) * (nrk + nentries + 1));

	/* expected per queue: the ring's running jobs */
	for (int i = 0; i < nrk; i++)
		add_expected(&exp, &nexp, &maxexp, rk_qids[i], 0, NULL, (int32) rk_counts[i]);
	/* and per key: the ring knows its keys by hash only */
	for (int i = 0; i < nrk; i++)
		add_expected(&exp, &nexp, &maxexp, rk_qids[i], rk_hashes[i], NULL, (int32) rk_counts[i]);

	for (int x = 0; x < nexp; x++)
	{
		Expected   *ex = &exp[x];
		Entry	   *q = NULL;
		Entry	   *k = NULL;

		for (int e = 0; e < nentries; e++)
		{
			if (entries[e].queue_id != ex->queue_id)
				continue;
			if (entries[e].keyhash == 0)
				q = &entries[e];
			else if (entries[e].keyhash == ex->keyhash)
				k = &entries[e];
		}
		if (ex->keyhash == 0)
		{
			if (q != NULL)
				q->expected = ex->count;
			else if (ex->count > 0)
			{
				/* running jobs of a queue the counters do not know */
				(*diffs)[ndiffs].queue_id = ex->queue_id;
				(*diffs)[ndiffs].fair_key = NULL;
				(*diffs)[ndiffs].expected = ex->count;
				(*diffs)[ndiffs].found = 0;
				ndiffs++;
			}
			continue;
		}
		/* a key: compared when the queue's keys are tracked and settled */
		if (q == NULL || !q->keys_valid || q->skip)
			continue;
		if (k == NULL || k->running != ex->count)
		{
			(*diffs)[ndiffs].queue_id = ex->queue_id;
			(*diffs)[ndiffs].fair_key = ex->name ? ex->name :
				psprintf("(key hash %016llx)", (unsigned long long) ex->keyhash);
			(*diffs)[ndiffs].expected = ex->count;
			(*diffs)[ndiffs].found = k ? k->running : 0;
			ndiffs++;
		}
		if (k != NULL)
			k->skip = true;		/* compared */
	}
	for (int e = 0; e < nentries; e++)
	{
		Entry	   *en = &entries[e];
		bool		queue_skipped = false;

		if (en->keyhash != 0)
		{
			/* a key entry no running job matched */
			for (int f = 0; f < nentries; f++)
				if (entries[f].queue_id == en->queue_id && entries[f].keyhash == 0 &&
					(entries[f].skip || !entries[f].keys_valid))
					queue_skipped = true;
			if (en->skip || queue_skipped || en->running == 0)
				continue;
			(*diffs)[ndiffs].queue_id = en->queue_id;
			(*diffs)[ndiffs].fair_key = psprintf("(key hash %016llx)", (unsigned long long) en->keyhash);
			(*diffs)[ndiffs].expected = 0;
			(*diffs)[ndiffs].found = en->running;
			ndiffs++;
			continue;
		}
		if (en->running != en->expected)
		{
			(*diffs)[ndiffs].queue_id = en->queue_id;
			(*diffs)[ndiffs].fair_key = NULL;
			(*diffs)[ndiffs].expected = en->expected;
			(*diffs)[ndiffs].found = en->running;
			ndiffs++;
		}
	}
	return ndiffs;
}
