/*-------------------------------------------------------------------------
 *
 * deps.h
 *	  Dependencies between jobs (enqueue(..., after)): see deps.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_DEPS_H
#define PGJQ_DEPS_H

#include "engine/dedup.h"
#include "engine/engine.h"

/* One new job's dependencies: existing job ids and earlier positions of the call. */
typedef struct PgjqJobDeps
{
	int			n;
	int64	   *ids;			/* existing jobs (n_ids of them) */
	int			n_ids;
	int		   *positions;		/* 0-based positions of the same call, each
								 * before this job's */
	int			n_positions;
} PgjqJobDeps;


extern int	pgjq_max_dependency_targets;

extern void pgjq_deps_startup(void);
extern Size pgjq_deps_shmem_size(void);
extern void pgjq_deps_shmem_init(bool found);

extern char pgjq_deps_failure_arg(FunctionCallInfo fcinfo, int argno);
extern void pgjq_deps_enqueue(const PgjqQueue *queue, PgjqNewJobs *jobs, PgjqJobDeps *deps,
							  char on_failure, PgjqStoreJobs store);
extern void pgjq_deps_note_finished(int64 id, char how);
extern int64 pgjq_deps_resolve_chunk(void);
extern int64 pgjq_deps_resolve_all(void);

#endif							/* PGJQ_DEPS_H */
