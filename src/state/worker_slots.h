/*-------------------------------------------------------------------------
 *
 * worker_slots.h
 *	  The worker slots in shared memory (worker_slots.c): wake a database's
 *	  worker when a commit makes a job due before its planned wake-up, and
 *	  the launcher when an extension is created.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_WORKER_SLOTS_H
#define PGJQ_WORKER_SLOTS_H

#include "common/pgjq_common.h"

/* allocation, by src/pgjq.c's shared-memory hooks */
extern Size pgjq_worker_slots_shmem_size(void);
extern bool pgjq_worker_slots_shmem_init(void);

/* True when pgjq was preloaded and its shared memory exists. */
extern bool pgjq_shmem_ready(void);
extern void pgjq_shmem_wake_worker(void);
extern void pgjq_shmem_wake_worker_at(TimestampTz due);
extern void pgjq_shmem_note_due(TimestampTz due);
extern void pgjq_shmem_worker_attach(Oid dboid);
extern void pgjq_shmem_worker_plan(TimestampTz wake_at);
extern void pgjq_shmem_stop_stray_workers(void);
extern void pgjq_shmem_launcher_attach(void);
extern bool pgjq_shmem_launcher_recheck(void);
extern void pgjq_shmem_worker_pass_done(TimestampTz start, TimestampTz end);

typedef struct PgjqWorkerPass
{
	char	   *dbname;
	TimestampTz end;
	int64		duration_us;
} PgjqWorkerPass;
extern int	pgjq_shmem_worker_passes(PgjqWorkerPass **passes);

#endif							/* PGJQ_WORKER_SLOTS_H */
