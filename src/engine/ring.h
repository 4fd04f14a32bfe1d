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
 * ring_shmem.c, ring_records.c and ring_xact.c (src/state) own the shared
 * state and the transaction callbacks; the ring_*.c files of src/engine
 * (ring_store_internal.h) the tables, the rebuild and the operations.  The
 * operations the SQL functions call are declared in engine.h with the rest
 * of the engine's interface; this header has those only the engine's own
 * files (and _PG_init) call.
 *
 *-------------------------------------------------------------------------
 */
#ifndef PGJQ_RING_H
#define PGJQ_RING_H

#include "engine/engine.h"

/* the jobs whose dependencies are met, from pgjq.job into the ring (deps.c) */
extern int64 pgjq_ring_promote_waiting(int n, const int64 *ids);

/*
 * on_duplicate => 'replace' (dedup.c): a ready ring job's next version, with
 * payload, waits in pgjq.job until *run_at (due, bounded by debounce_max
 * after its enqueue), *state 's' or 'r'; false, nothing changed, if id is
 * not a ready ring job
 */
extern bool pgjq_ring_replace_ready(int64 id, Datum payload, TimestampTz due,
									int64 debounce_max_us, TimestampTz now, char *state,
									TimestampTz *run_at);

/*
 * the ring's running jobs per (queue, fair key's hash), of one queue or (0)
 * all: how many in (*counts)[i]; limits.c counts them when it builds its
 * counters (through pgjq_limits_running_keys_hook, set by _PG_init)
 */
extern int	pgjq_ring_running_keys(int32 queue_id, int32 **qids, uint64 **hashes,
								   int64 **counts);

/*
 * the holds of pgjq.key_holds still in the future, for the rebuild (no lock
 * held: key_holds.c); ring_holds_install takes them in
 */
struct RingHoldRow;
extern int	ring_holds_read(struct RingHoldRow **rows);

#endif							/* PGJQ_RING_H */
