/*-------------------------------------------------------------------------
 *
 * deps.h
 *	  Dependencies between jobs (enqueue(..., after)): see deps.c.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_DEPS_H
#define PGJQ_DEPS_H

#include "engine/engine.h"

/* what only _PG_init wires: its setting, shared memory and the wait hook */
extern int	pgjq_max_dependency_targets;

extern void pgjq_deps_startup(void);
extern Size pgjq_deps_shmem_size(void);
extern void pgjq_deps_shmem_init(bool found);

extern void pgjq_deps_note_finished(int64 id, char how);

#endif							/* PGJQ_DEPS_H */
