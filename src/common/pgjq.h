/*-------------------------------------------------------------------------
 *
 * pgjq.h
 *	  Declarations shared by the pgjq modules: settings, module init hooks,
 *	  shared-memory wake-ups and version compatibility shims.
 *
 * Each .c file keeps its statics private; this header only carries what
 * more than one file needs.  The SQL-callable functions are declared next to
 * their definitions with PG_FUNCTION_INFO_V1.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_H
#define PGJQ_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "fmgr.h"

/* guc.c */
extern char *pgjq_database_names;
extern int	pgjq_max_payload_size;
extern int	pgjq_max_sleep_ms;
extern int	pgjq_prune_interval_ms;
extern int	pgjq_max_tracked_keys;
extern int	pgjq_max_databases;
extern int	pgjq_max_wait_ms;
extern int	pgjq_horizon_warn_after_s;
extern int	pgjq_max_metrics_queues;
extern int	pgjq_max_metrics_claims;
extern char *pgjq_debug_crash_at;
extern char *pgjq_debug_pause_at;
extern void pgjq_guc_init(void);

/* crash_points.c (test only) */
extern void pgjq_crash_point(const char *point);

/* shmem.c */
extern void pgjq_shmem_init(void);
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

/* bgworker.c */
extern void pgjq_bgworker_init(void);
extern PGDLLEXPORT void pgjq_launcher_main(Datum main_arg);
extern PGDLLEXPORT void pgjq_worker_main(Datum main_arg);

/* args.c: an interval in microseconds (30-day months), clamped */
extern int64 pgjq_interval_usec(const Interval *iv);

/*
 * maintenance.c: each step in the caller's transaction; the SQL functions
 * do a whole backlog, the worker a chunk (or one partition) per transaction
 */
#define PGJQ_MAINTENANCE_CHUNK	1000
extern int64 pgjq_maintenance_promote(void);
extern int64 pgjq_maintenance_rescue(void);
extern int64 pgjq_maintenance_prune(void);
extern int64 pgjq_maintenance_promote_chunk(void);
extern int64 pgjq_maintenance_rescue_chunk(void);
extern int64 pgjq_maintenance_ring_reclaim(int limit);
extern int64 pgjq_maintenance_ring_reclaim_chunk(void);
extern void pgjq_maintenance_prune_prepare(void);
extern int64 pgjq_maintenance_summarize(void);
extern int	pgjq_maintenance_prune_one(int skip, int64 *pruned);

/* schedule.c: periodic jobs, fired by the background worker */
extern int64 pgjq_schedule_fire_chunk(void);
extern TimestampTz pgjq_schedule_next_slot(void);
extern TimestampTz pgjq_maintenance_next_deadline(void);

/* The largest batch claim() hands out and the largest enqueue_many() call. */
#define PGJQ_MAX_BATCH			10000
#define PGJQ_MAX_ENQUEUE_MANY	100000

/* Limits on text arguments, in bytes (documented in README.md). */
#define PGJQ_MAX_QUEUE_NAME		128
#define PGJQ_MAX_KEY			512
#define PGJQ_MAX_WORKER			256
#define PGJQ_MAX_ERROR			8192

/* Version shims: keep one spelling in the code for PostgreSQL 13 to 18. */
#if PG_VERSION_NUM < 150000
#define MarkGUCPrefixReserved(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

#endif							/* PGJQ_H */
