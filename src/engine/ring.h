/*-------------------------------------------------------------------------
 *
 * ring.h
 *	  The ring engine: job bodies appended once to a ring of four tables,
 *	  claims taken from shared memory, space back by TRUNCATE (docs/design.md,
 *	  "The ring engine").
 *
 * Every queue's jobs that are due live in the ring from enqueue to their
 * end; every claim takes from the ring.  A running job never leaves the
 * ring: every outcome
 * closes its claim with one log row ('d' completed, 'f' failed, snoozed or
 * rescued, 'x' cancelled) and writes the job once where it goes (the
 * history, or a scheduled row of pgjq.job for a retry or a snooze, which
 * promotion appends to the ring again when it is due); a heartbeat writes
 * one 'h' row and a cancellation request one 'q' row, applied to the
 * in-flight entry at commit.  A job with a dedup_key holds its key with an
 * anchor row in pgjq.job (state 'n'), which its end deletes.  What waits in
 * pgjq.job instead: delayed jobs until due, and ready rows (redriven dead
 * jobs, a backlog beyond the ring's shared memory, a promotion the ring had
 * no room for).  While pgjq.job may have ready rows of a queue (a flag in
 * shared memory, cleared by a claim that found none there), its claims move
 * up to a batch of them into the ring first.
 *
 * ring_shmem.c owns the shared state and the transaction callbacks;
 * the ring_*.c files of src/engine (ring_store_internal.h) the tables, the
 * rebuild and the operations below.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_H
#define PGJQ_RING_H

#include "engine/storage.h"

/* guc.c */
extern int	pgjq_ring_positions;
extern int	pgjq_ring_max_in_flight;
extern int	pgjq_ring_max_lanes;
extern int	pgjq_ring_max_holds;
extern int	pgjq_ring_max_rate_keys;
extern int	pgjq_ring_max_queues;
extern int	pgjq_ring_slot_rows;

/* ring_shmem.c: allocation, called by shmem.c */
extern Size pgjq_ring_shmem_size(void);
extern void pgjq_ring_shmem_init(bool found);
extern void pgjq_ring_startup(void);

/* ERROR (55000, with a hint) unless the ring's shared memory exists */
extern void pgjq_ring_require(void);

/*
 * Whether the ring has positions for n more ready jobs, with headroom
 * (1/16 of pgjq.ring_positions) for producers that ask at the same time;
 * when it has not, enqueue stores the jobs in pgjq.job instead (claims find
 * them there), so a backlog beyond the ring's shared memory is slower, not
 * refused.  True without the preload (the ring's calls then say what is
 * missing).
 */
extern bool pgjq_ring_has_room(int n);

/* ring_*.c: the engine's operations, between pgjq_storage_begin/end */
extern void pgjq_ring_enqueue(int32 queue_id, int32 max_attempts, PgjqNewJobs *jobs);
extern int	pgjq_ring_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
							const char *worker, PgjqClaimQuota *quota, int64 *token,
							PgjqClaimedJob *jobs);

/*
 * Whether a claim of the queue should move ready rows of pgjq.job into the
 * ring first: it may have some.  *gen is what to pass to
 * pgjq_ring_table_empty when it then had none.
 */
extern bool pgjq_ring_table_first(int32 queue_id, uint64 *gen);
extern void pgjq_ring_table_empty(int32 queue_id, uint64 gen);

/*
 * Complete the pairs that are jobs in flight (the others are stale).
 * results (jsonb, NULL pointer for none; an element with result_nulls[i]
 * set has none) are kept with the completed jobs in job_done.  Returns how
 * many it completed.
 */
extern int64 pgjq_ring_complete(int n, Datum *ids, Datum *tokens, const Datum *results,
								const bool *result_nulls, TimestampTz now);

/* what became of (id, token) */
#define PGJQ_RING_NOT_MINE	0	/* not a job in flight */
#define PGJQ_RING_STALE		1	/* a ring job, but the token is stale */

/*
 * Extend the lease of (id, token) to now + extend_us (the queue's lease when
 * negative), but not past its claim's deadline (the queue's timeout), if it
 * is a ring job in flight: PGJQ_RING_EXTENDED (*lease_until set),
 * PGJQ_RING_CANCELLED (its cancellation was requested: it ended as
 * cancelled), PGJQ_RING_TIMED_OUT (its deadline has passed: nothing
 * changes, rescue ends the attempt), PGJQ_RING_STALE, or PGJQ_RING_NOT_MINE.
 */
#define PGJQ_RING_EXTENDED	3
#define PGJQ_RING_CANCELLED	5
#define PGJQ_RING_TIMED_OUT	6

/* the execution deadline of (id, token) in flight; 0 if none or not in flight */
extern TimestampTz pgjq_ring_deadline(int64 id, int64 token);

/*
 * fail (snooze_until 0) or snooze of (id, token) if it is a ring job in
 * flight, without moving it first; lease_before (rescue): only if its lease
 * ends before that.  PGJQ_RING_FAILED with *outcome ('s': scheduled at
 * *run_at in pgjq.job; or PGJQ_FINISHED_DEAD), PGJQ_RING_STALE, or
 * PGJQ_RING_NOT_MINE.
 */
#define PGJQ_RING_FAILED	4
extern int	pgjq_ring_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
						   TimestampTz snooze_until, TimestampTz lease_before,
						   TimestampTz now, char *outcome, TimestampTz *run_at);
extern int	pgjq_ring_heartbeat(int64 id, int64 token, int64 extend_us, TimestampTz now,
								TimestampTz *lease_until);

/*
 * due jobs from pgjq.job into the ring (maintenance.c); ready rows of a
 * queue into the ring (a claim: *left, some may be left)
 */
extern int64 pgjq_ring_promote(TimestampTz now, int limit);
extern int64 pgjq_ring_promote_waiting(int n, const int64 *ids);
extern int64 pgjq_ring_promote_ready(int32 queue_id, int limit, bool *left);
extern void pgjq_ring_refusals(int64 *n, TimestampTz *at, const char **bound);

/*
 * cancel of a ring job in flight: its cancellation is requested (true); of
 * a ready one: it ends as cancelled (true); false if it is neither
 */
extern bool pgjq_ring_request_cancel(int64 id);

/* cancel of a ready ring job: it ends as cancelled; false if none */
extern bool pgjq_ring_take_ready(int64 id);

/* alter_queue changed key_rate or key_burst: its throttled keys come back (key_rate.c) */
extern void pgjq_ring_rates_altered(int32 queue_id);

/*
 * on_duplicate => 'replace' (dedup.c): a ready ring job's next version, with
 * payload, waits in pgjq.job until *run_at (due, bounded by debounce_max
 * after its enqueue), *state 's' or 'r'; false, nothing changed, if id is
 * not a ready ring job
 */
extern bool pgjq_ring_replace_ready(int64 id, Datum payload, TimestampTz due,
									int64 debounce_max_us, TimestampTz now, char *state,
									TimestampTz *run_at);

/* ring claims whose lease ended before now (at most limit) */
extern int	pgjq_ring_running_keys(int32 queue_id, int32 **qids, uint64 **hashes,
								   int64 **counts);

/* alter_queue changed the queue's limits (lanes unparked at commit) */
extern void pgjq_ring_queue_altered(int32 queue_id);

/* a claim of the queue could take a ring job now (a lane not parked) */
extern bool pgjq_ring_claimable(int32 queue_id);

/* limits.c: keys whose running count went down (never fails) */
extern void pgjq_ring_keys_freed(int n, const int32 *queue_ids, const uint64 *hashes);

/* one step of giving space back: truncation, or relocation of stragglers */
#define PGJQ_RING_RECLAIM_MAX 100000
extern int64 pgjq_ring_reclaim(int limit);

extern int	pgjq_ring_expired(TimestampTz now, int limit, int64 *ids, int64 *tokens);
extern TimestampTz pgjq_ring_next_deadline(void);

/*
 * purge (drop false): end the queue's ready ring jobs.  drop_queue (drop
 * true): the same, and with force its running ones too; without force,
 * nothing changes when it has running ones.  Waits for open transactions
 * that claim or finish the queue's ring jobs.  Returns how many running ring
 * jobs the queue has, *ready how many ready ones it ended.
 */
extern int64 pgjq_ring_drop_jobs(int32 queue_id, bool drop, bool force, int64 *ready);

/* verify(): where shared memory and the ring's tables disagree */
extern int	pgjq_ring_verify(PgjqVerifyRow **rows);

/*
 * the ring's ready and running jobs of a queue, and when its oldest ready
 * job was enqueued (0: none), from shared memory; committed: as the
 * committed state says (a claim still open leaves its jobs ready), else as
 * a claim would find them now
 */
extern void pgjq_ring_counts(int32 queue_id, bool committed, int64 *ready, int64 *running,
							 TimestampTz *oldest);

/*
 * key_hold.c: hold a fair key of a queue until a time (claims skip its
 * ready ring jobs without touching them), or release it.  Both take effect
 * when the transaction commits; the durable row is pgjq.key_holds.
 */
extern void pgjq_key_hold(int32 queue_id, const char *fair_key, TimestampTz until);
extern bool pgjq_key_release(int32 queue_id, const char *fair_key);

/* the job's queue and fair key ("" for none) if (id, token) is in flight */
extern bool pgjq_ring_job_key(int64 id, int64 token, int32 *queue_id, char **fair_key);

/* the earliest end of a hold in this database (DT_NOEND: none) */
extern TimestampTz pgjq_ring_hold_next(void);

#endif							/* PGJQ_RING_H */
