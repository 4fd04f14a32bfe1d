/*-------------------------------------------------------------------------
 *
 * dedup.h
 *	  enqueue's dedup options: how long a dedup_key holds (dedup_scope,
 *	  dedup_for) and what a duplicate does (on_duplicate, debounce_max).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_DEDUP_H
#define PGJQ_DEDUP_H

#include "engine/engine.h"

typedef struct PgjqDedup
{
	char		scope;			/* 0 until the job ends ('unfinished'), 'w'
								 * until its claim ('waiting'), 'p' for for_us
								 * from its enqueue */
	int64		for_us;
	bool		replace;		/* on_duplicate => 'replace' */
	int64		debounce_max_us;	/* 0: no bound */
} PgjqDedup;

/*
 * The four arguments from argno on (dedup_scope, dedup_for, on_duplicate,
 * debounce_max); keyed: the call has a dedup_key (keys_arg names it).
 */
extern void pgjq_dedup_args(FunctionCallInfo fcinfo, int argno, bool keyed,
							const char *keys_arg, PgjqDedup *d);

typedef void (*PgjqStoreJobs) (const PgjqQueue *queue, PgjqNewJobs *jobs);

/*
 * Store the jobs as store() does, with the dedup options: jobs->ids[i] is
 * the new job's id, or that of the job holding its key (whose payload and
 * run_at a replace changed, if it was still waiting).  Between
 * pgjq_storage_begin and end.
 */
extern void pgjq_dedup_store(const PgjqQueue *queue, PgjqNewJobs *jobs, const PgjqDedup *d,
							 PgjqStoreJobs store);

/* Delete up to limit dedup_for keys that ended before now; returns how many. */
extern int64 pgjq_dedup_prune(TimestampTz now, int limit);

#endif							/* PGJQ_DEDUP_H */
