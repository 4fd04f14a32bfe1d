/*-------------------------------------------------------------------------
 *
 * pgjq.c
 *	  Module entry point: _PG_init, which calls each module's init, and the
 *	  wiring of the layers that only the top may do.
 *
 * Loaded through shared_preload_libraries, pgjq reserves shared memory and
 * registers its background worker launcher; loaded on demand (first call of a
 * pgjq function), it only defines its settings and everything that does not
 * need shared memory works.
 *
 * The layers call down only (test/layers-check): where a lower layer must
 * reach a higher one, it declares a hook and this file sets it.
 *  - Shared memory: the shmem_request and shmem_startup hooks here ask each
 *    module for its size and attach it (worker slots, limit counters,
 *    waiters, metrics, the ring, dependencies), in that order, under
 *    AddinShmemInitLock.  Named LWLock tranche "pgjq": 0 worker slots,
 *    1 limit counters, 2 waiters, 3 metrics, 4 ring, 5 dependencies.
 *  - The engine's events (engine.h): limits.c follows left_running and the
 *    begin of a call, wait.c and the ring follow became_ready, the metric
 *    counters (state/metric_counters.c) left_running, the begin of a call
 *    and jobs_finished.  Each hook calls the one registered before it
 *    first, so the order of registration below is the order they run in:
 *    limits.c before the metric counters, wait.c before the ring.
 *  - The API's guard (api/guard.h) is src/citus/ownership.c: under Citus a
 *    call runs only on the node that serves its queue or issued its ids;
 *    the Citus mode also follows the begin of every call (two-phase commit
 *    of pgjq's local writes next to remote ones, citus/citus_mode.c).
 *  - What state needs from above: limits.c the ring's running keys
 *    (engine) and the ring's keys freed (state/ring_records.c, below it in no
 *    order of files), wait.c the dependency tracking (engine/deps.c).
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "citus/citus_mode.h"
#include "citus/moves.h"
#include "citus/ownership.h"
#include "common/guc.h"
#include "engine/deps.h"
#include "engine/ring.h"
#include "state/key_rate.h"
#include "state/limits.h"
#include "state/ring_records.h"
#include "state/metric_counters.h"
#include "state/ring_shmem.h"
#include "state/ring_xact.h"
#include "state/wait.h"
#include "state/worker_slots.h"
#include "worker/bgworker.h"

#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static PgjqLeftRunningHook prev_left_running_hook = NULL;
static PgjqStorageBeginHook prev_storage_begin_hook = NULL;
static PgjqLeftRunningHook prev_left_running_metrics_hook = NULL;
static PgjqStorageBeginHook prev_storage_begin_metrics_hook = NULL;
static PgjqStorageBeginHook prev_storage_begin_citus_hook = NULL;
static PgjqJobsFinishedHook prev_jobs_finished_hook = NULL;
static PgjqBecameReadyHook prev_became_ready_wait_hook = NULL;
static PgjqBecameReadyHook prev_became_ready_ring_hook = NULL;

static void
request_shmem(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(add_size(pgjq_worker_slots_shmem_size(),
													  pgjq_metrics_shmem_size()),
											 add_size(pgjq_limits_shmem_size(),
													  pgjq_wait_shmem_size())),
									add_size(pgjq_ring_shmem_size(), pgjq_deps_shmem_size())));

	/*
	 * 0: worker slots, 1: limit counters, 2: waiters, 3: metrics, 4: ring, 5:
	 * dependencies
	 */
	RequestNamedLWLockTranche("pgjq", 6);
}

static void
startup_shmem(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	found = pgjq_worker_slots_shmem_init();
	pgjq_limits_shmem_init(found);
	pgjq_wait_shmem_init(found);
	pgjq_metrics_shmem_init(found);
	pgjq_ring_shmem_init(found);
	pgjq_deps_shmem_init(found);
	LWLockRelease(AddinShmemInitLock);
}

/* the engine's hooks, for the state layer (see the file header) */
static void
limits_left_running(int32 queue_id, const char *fair_key, uint64 keyhash, int n)
{
	if (prev_left_running_hook)
		prev_left_running_hook(queue_id, fair_key, keyhash, n);
	pgjq_limits_left_running(queue_id, fair_key, keyhash, n);
}

static void
limits_storage_begin(void)
{
	if (prev_storage_begin_hook)
		prev_storage_begin_hook();
	pgjq_limits_storage_begin();
}

static void
metrics_left_running(int32 queue_id, const char *fair_key, uint64 keyhash, int n)
{
	if (prev_left_running_metrics_hook)
		prev_left_running_metrics_hook(queue_id, fair_key, keyhash, n);
	pgjq_metrics_left_running(queue_id);
}

static void
metrics_storage_begin(void)
{
	if (prev_storage_begin_metrics_hook)
		prev_storage_begin_metrics_hook();
	pgjq_metrics_storage_begin();
}

/* Citus's two-phase commit for pgjq's local writes (citus/citus_mode.c) */
static void
citus_storage_begin(void)
{
	if (prev_storage_begin_citus_hook)
		prev_storage_begin_citus_hook();
	pgjq_citus_note_write();
}

/* the engine's final states (PGJQ_FINISHED_*) as the counters name them */
static void
metrics_jobs_finished(int32 queue_id, char state, int n)
{
	PgjqMetric	m;

	if (prev_jobs_finished_hook)
		prev_jobs_finished_hook(queue_id, state, n);
	switch (state)
	{
		case PGJQ_FINISHED_COMPLETED:
			m = PGJQ_M_COMPLETED;
			break;
		case PGJQ_FINISHED_DEAD:
			m = PGJQ_M_DEAD;
			break;
		case PGJQ_FINISHED_CANCELLED:
			m = PGJQ_M_CANCELLED;
			break;
		default:
			m = PGJQ_M_NCOUNTERS;	/* not counted */
			break;
	}
	pgjq_metrics_jobs_finished(queue_id, m, n);
}

static void
wait_became_ready(int32 queue_id, int n)
{
	if (prev_became_ready_wait_hook)
		prev_became_ready_wait_hook(queue_id, n);
	pgjq_wait_note_ready(queue_id, n);
}

static void
ring_became_ready(int32 queue_id, int n)
{
	if (prev_became_ready_ring_hook)
		prev_became_ready_ring_hook(queue_id, n);
	pgjq_ring_became_ready(queue_id, n);
}

/* While shared_preload_libraries is processed: shared memory and hooks. */
static void
preload_init(void)
{
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = request_shmem;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = startup_shmem;
	prev_left_running_hook = pgjq_left_running_hook;
	pgjq_left_running_hook = limits_left_running;
	prev_storage_begin_hook = pgjq_storage_begin_hook;
	pgjq_storage_begin_hook = limits_storage_begin;
	prev_became_ready_wait_hook = pgjq_became_ready_hook;
	pgjq_became_ready_hook = wait_became_ready;
	prev_storage_begin_metrics_hook = pgjq_storage_begin_hook;
	pgjq_storage_begin_hook = metrics_storage_begin;
	prev_left_running_metrics_hook = pgjq_left_running_hook;
	pgjq_left_running_hook = metrics_left_running;
	prev_jobs_finished_hook = pgjq_jobs_finished_hook;
	pgjq_jobs_finished_hook = metrics_jobs_finished;
	if (pgjq_citus_preloaded())
	{
		prev_storage_begin_citus_hook = pgjq_storage_begin_hook;
		pgjq_storage_begin_hook = citus_storage_begin;
	}
	pgjq_ring_startup();
	prev_became_ready_ring_hook = pgjq_became_ready_hook;
	pgjq_became_ready_hook = ring_became_ready;
	pgjq_deps_startup();
}

void
_PG_init(void)
{
	pgjq_guc_init();
	pgjq_citus_moves_init();
	/* what the state layer calls above it (see the file header) */
	pgjq_limits_running_keys_hook = pgjq_ring_running_keys;
	pgjq_limits_keys_freed_hook = pgjq_ring_keys_freed;
	pgjq_wait_finished_hook = pgjq_deps_note_finished;

	/*
	 * the API's guard: which node serves a call, only where Citus can be on
	 * (on a single server the hooks stay NULL: one test per call)
	 */
	if (pgjq_citus_preloaded())
	{
		pgjq_queue_guard_hook = pgjq_citus_guard_queue;
		pgjq_ids_guard_hook = pgjq_citus_guard_ids;
	}
	if (!process_shared_preload_libraries_in_progress)
		return;
	preload_init();
	pgjq_bgworker_init();
}
