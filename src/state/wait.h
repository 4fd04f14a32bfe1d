/*-------------------------------------------------------------------------
 *
 * wait.h
 *	  The wake-ups of waiting claims and of wait_jobs() callers (wait.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_WAIT_H
#define PGJQ_WAIT_H

#include "common/pgjq_common.h"

#define PGJQ_WAIT_MAX_QUEUES 32
extern Size pgjq_wait_shmem_size(void);
extern void pgjq_wait_shmem_init(bool found);
extern void pgjq_wait_register(int nqueues, const int32 *queue_ids, bool await);
extern void pgjq_wait_rearm(void);
extern void pgjq_wait_sleep(TimestampTz until);
extern uint32 pgjq_wait_woken(void);
extern void pgjq_wait_used(uint32 queues);
extern void pgjq_wait_leaving_ready(void);
extern void pgjq_wait_unregister(void);
extern void pgjq_wait_note_ready(int32 queue_id, int n);
extern void pgjq_wait_note_claimed(int32 queue_id, int n);
extern void pgjq_wait_wake(Oid dboid, int32 queue_id, int n);
extern void pgjq_wait_note_finished(int64 id, char how);
extern void pgjq_wait_jobs_register(int n, const int64 *ids);
extern void pgjq_wait_jobs_unregister(void);
extern void pgjq_wait_jobs_sleep(TimestampTz until);

/*
 * Also told of every job pgjq_wait_note_finished hears of, first: the jobs
 * that wait on it (engine/deps.c's pgjq_deps_note_finished, set by
 * _PG_init)
 */
typedef void (*PgjqJobFinishedHook) (int64 id, char how);
extern PgjqJobFinishedHook pgjq_wait_finished_hook;

#endif							/* PGJQ_WAIT_H */
