/*-------------------------------------------------------------------------
 *
 * ring_outcome.c
 *	  Outcomes of ring jobs in flight: complete, fail (retry, dead or
 *	  cancelled), snooze, rescue, heartbeat and the cancellation request, and
 *	  the reads of in-flight entries the rescue and the worker need.
 *
 * Order of an outcome: a shared look first (not in flight: stale, without
 * the exclusive lock); then the claim is closed in shared memory
 * (ring_close_claims: under the ring's LWLock, exclusive, waiting outside it
 * for a transaction that claims, closes or extends the same entry); then one
 * log row per claim token closes it durably ('d', 'f', 'x'; 'h' and 'q' for
 * a heartbeat and a cancellation request), and the job is written once where
 * it goes (the history, or a scheduled row of pgjq.job).  The entry leaves
 * the in-flight table when the transaction commits (ring_xact.c).  A
 * completion gives space back last, so that the slot's lock is not held
 * while it waits for anyone.
 *
 *-------------------------------------------------------------------------
 */
#include "engine/ring_store_internal.h"
#include "common/args.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/index.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/execnodes.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "storage/proc.h"
#include "storage/procarray.h"

/* ---------------------------------------------------------------------
 * outcomes
 * --------------------------------------------------------------------- */

/*
 * Lock held: wait until no other open transaction claims, closes or extends
 * the in-flight entry of id whose token is token (0: any), and return it
 * (NULL: none; the lock is held again).
 */
static RingFlight *
flight_settled(int64 id, int64 token, TransactionId xid)
{
	for (;;)
	{
		RingFlight *f = ring_flight_find(id);
		TransactionId other;

		if (f == NULL || f->xid == xid || f->state == RF_OPEN ||
			(token != 0 && f->token != token))
			return f;
		other = f->xid;
		LWLockRelease(ring->lock);
		XactLockTableWait(other, NULL, NULL, XLTW_None);
		LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	}
}

/*
 * Close the ring claims (id, token) as this transaction's, waiting for a
 * transaction that closes one of them now.  token 0 matches any open claim
 * (cancel).  found[i]: the id is a ring job in flight (else the table
 * engine's); ok[i]: it is closed by this call (else stale).  The closed
 * entries' facts go to *fl (copies).  With lease_before (rescue), only a
 * claim whose lease ends before it is closed (a heartbeat that committed
 * meanwhile makes the pair stale for rescue).
 */
int
ring_close_claims(int n, const int64 *ids, const int64 *toks, bool *found, bool *ok,
				  RingFlight *fl, TimestampTz lease_before)
{
	TransactionId xid = GetTopTransactionId();
	int			nok = 0;

	ring_reserve_local(0, 0, n);
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		RingFlight *f = flight_settled(ids[i], toks[i], xid);

		/*
		 * A job this transaction already closed (completed, failed or taken
		 * out) is no job in flight for it any more: stale (a retried job is a
		 * scheduled row of pgjq.job, a finished one is history).
		 */
		if (f != NULL && f->state == RF_CLOSING && f->xid == xid)
			f = NULL;
		found[i] = f != NULL;
		ok[i] = false;
		if (f == NULL || (toks[i] != 0 && f->token != toks[i]))
			continue;

		/*
		 * OPEN, or claimed or heartbeated by this very transaction (claim and
		 * outcome together)
		 */
		if (!(f->state == RF_OPEN ||
			  ((f->state == RF_CLAIMING || f->state == RF_EXTENDING) && f->xid == xid)))
			continue;
		if (lease_before != 0 && f->lease_until >= lease_before)
			continue;
		ring_note_closed(ids[i], f->state == RF_CLAIMING, f->state == RF_EXTENDING);
		f->state = RF_CLOSING;
		f->xid = xid;
		fl[i] = *f;
		ok[i] = true;
		nok++;
	}
	LWLockRelease(ring->lock);
	return nok;
}

/* Is any of the ids a job in flight? (a shared look: the fast "stale") */
static bool
any_in_flight(int n, const int64 *ids)
{
	bool		any = false;

	if (hash_get_num_entries(ring_flights) == 0)
	{
		/* the count is read without the lock: look again with it */
		LWLockAcquire(ring->lock, LW_SHARED);
		any = hash_get_num_entries(ring_flights) > 0;
		LWLockRelease(ring->lock);
		if (!any)
			return false;
	}
	LWLockAcquire(ring->lock, LW_SHARED);
	for (int i = 0; i < n && !any; i++)
		any = ring_flight_find(ids[i]) != NULL;
	LWLockRelease(ring->lock);
	return any;
}
static int
u64_cmp(const void *a, const void *b)
{
	uint64		x = *(const uint64 *) a;
	uint64		y = *(const uint64 *) b;

	return (x > y) - (x < y);
}


/*
 * Without the preload (a server restarted without it) the ring's state is
 * not there to act on: an outcome for a job whose body is in the ring's
 * tables raises 55000 with the hint, rather than answering "stale" or
 * "not found" for a job that job(id) still shows ready or running.
 */
void
ring_require_for_jobs(int n, const int64 *ids)
{
	BodyRow		b;
	int			slot;
	ItemPointerData tid;

	if (ring != NULL || !ring_tables_known())
		return;
	for (int i = 0; i < n; i++)
		if (ring_body_by_id(ids[i], &b, &slot, &tid, true))
			pgjq_ring_require();
}

/*
 * Could id be a job in flight?  (The outcomes on one job ask first: no
 * means stale, without taking the lock exclusively.)
 */
static bool
maybe_in_flight(int64 id)
{
	ring_require_for_jobs(1, &id);
	return ring != NULL && ring_ensure_ready(false) && any_in_flight(1, &id);
}

/*
 * One row of the history for a ring job that ends other than by completing
 * (dead, or cancelled: without its payload, as pgjq.job's jobs end), and the
 * jobs-finished hook.  The caller closed its claim.
 */
static PgjqPlan plan_history_one = {
	"INSERT INTO pgjq.job_history (id, queue_id, state, priority, fair_key, dedup_key,"
	"                              attempt, max_attempts, token, enqueued_at, finished_at,"
	"                              worker, last_error, payload, timeout)"
	" VALUES ($1, $2, $3, $4, coalesce($5, ''), $14, $6, $7, $8, $9, $10, $11, $12, $13, $15)",
	15, {INT8OID, INT4OID, CHAROID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID,
	TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INTERVALOID}
};

void
ring_history_one(const BodyRow *b, char state, int32 attempt, int64 token, const char *worker,
				 Datum last_error, TimestampTz now)
{
	Datum		values[15];
	char		nulls[16] = "               ";

	values[0] = Int64GetDatum(b->id);
	values[1] = Int32GetDatum(b->queue_id);
	values[2] = CharGetDatum(state);
	values[3] = Int16GetDatum(b->priority);
	values[4] = b->fair_key;
	nulls[4] = b->fair_key ? ' ' : 'n';
	values[5] = Int32GetDatum(attempt);
	values[6] = Int32GetDatum(b->max_attempts);
	values[7] = Int64GetDatum(token);
	values[8] = TimestampTzGetDatum(b->enqueued_at);
	values[9] = TimestampTzGetDatum(now);
	values[10] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
	nulls[10] = worker ? ' ' : 'n';
	values[11] = last_error;
	nulls[11] = last_error ? ' ' : 'n';
	/* a dead job keeps its payload for retry_dead */
	values[12] = b->payload;
	nulls[12] = state == PGJQ_FINISHED_DEAD ? ' ' : 'n';
	values[13] = b->dedup_key;
	nulls[13] = b->dedup_key ? ' ' : 'n';
	values[14] = b->timeout_us > 0 ? pgjq_interval_datum(b->timeout_us) : (Datum) 0;
	nulls[14] = b->timeout_us > 0 ? ' ' : 'n';
	pgjq_history_ensure(now);
	pgjq_spi_run(&plan_history_one, values, nulls, 0);
	pgjq_wait_note_finished(b->id, state);
	if (b->dedup_key)
		ring_anchors_end(1, &b->id);
	if (pgjq_jobs_finished_hook)
		pgjq_jobs_finished_hook(b->queue_id, state, 1);
}

/* The body of a closed in-flight job, and its claim's worker. */
void
ring_closed_body(const RingFlight *f, BodyRow *b, char **worker)
{
	Relation	rel = table_open(ring_body_oid[f->slot], AccessShareLock);

	ring_body_fetch(rel, f->key.id, (ItemPointer) &f->tid, b);
	table_close(rel, NoLock);
	*worker = ring_claim_worker(f->claim_slot, (ItemPointer) &f->claim_tid, f->token);
}

/* limits.c counted the claim's job running; the lane lives while it closes */
static void
left_running(const RingFlight *f)
{
	if (pgjq_left_running_hook)
		pgjq_left_running_hook(f->queue_id, NULL, ring_limits_hash(f->lane->key.keyhash), 1);
}

/*
 * The closed claims of a completion made durable: one 'd' log row per
 * distinct token, then the dedup anchors of the completed jobs ended (a
 * cancelled one's goes with its history row, complete_cancelled).
 */
static void
complete_log(int n, const int64 *idv, const int64 *tokv, const bool *ok, int nok,
			 const RingFlight *fl, TimestampTz now)
{
	int64	   *cid = palloc(sizeof(int64) * nok);
	int64	   *ctok = palloc(sizeof(int64) * nok);
	int			m = 0;

	for (int i = 0; i < n; i++)
		if (ok[i])
		{
			cid[m] = idv[i];
			ctok[m] = tokv[i];
			m++;
		}
	ring_log_closes('d', now, nok, cid, ctok);

	/* the anchors of completed jobs with a dedup_key (cancelled: below) */
	m = 0;
	for (int i = 0; i < n; i++)
		if (ok[i] && fl[i].anchored && !fl[i].cancel_requested)
			cid[m++] = idv[i];
	ring_anchors_end(m, cid);
}

/*
 * a job whose cancellation was requested ends as cancelled, and does not
 * count as completed (as in pgjq.job); returns how many (ok[i] cleared)
 */
static int
complete_cancelled(int n, bool *ok, const RingFlight *fl, TimestampTz now)
{
	int			ncancelled = 0;

	for (int i = 0; i < n; i++)
		if (ok[i] && fl[i].cancel_requested)
		{
			BodyRow		b;
			char	   *worker;

			ring_closed_body(&fl[i], &b, &worker);
			ring_history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt, fl[i].token, worker,
							 b.last_error, now);
			left_running(&fl[i]);
			ok[i] = false;
			ncancelled++;
		}
	return ncancelled;
}

/*
 * The history of the completed jobs of one queue, those of fl[first]'s
 * (ok[j] cleared for each): one job_done row, the waiters told, the
 * jobs-finished hook, and limits.c's running counts per key.
 *
 * results ($8) is NULL when the call gave none for the queue's jobs: no byte
 */
static void
complete_queue_done(int first, int n, const int64 *idv, bool *ok, const RingFlight *fl,
					const Datum *results, const bool *result_nulls, TimestampTz now)
{
	Datum	   *di,
			   *da,
			   *de,
			   *dr;
	bool	   *drn;
	bool		any_result = false;
	int			c = 0;
	int32		qid = fl[first].queue_id;
	int64		lo = PG_INT64_MAX,
				hi = PG_INT64_MIN;
	Datum		values[PGJQ_DONE_NATTS];
	bool		nulls[PGJQ_DONE_NATTS] = {false};
	uint64	   *kh;

	di = palloc(sizeof(Datum) * n);
	da = palloc(sizeof(Datum) * n);
	de = palloc(sizeof(Datum) * n);
	dr = palloc(sizeof(Datum) * n);
	drn = palloc(sizeof(bool) * n);
	kh = palloc(sizeof(uint64) * n);
	for (int j = first; j < n; j++)
		if (ok[j] && fl[j].queue_id == qid)
		{
			/* the lane lives while its running count holds this job */
			kh[c] = ring_limits_hash(fl[j].lane->key.keyhash);
			di[c] = Int64GetDatum(idv[j]);
			da[c] = Int32GetDatum(fl[j].attempt);
			de[c] = TimestampTzGetDatum(fl[j].enqueued_at);
			drn[c] = results == NULL || result_nulls[j];
			dr[c] = drn[c] ? (Datum) 0 : results[j];
			any_result |= !drn[c];
			lo = Min(lo, idv[j]);
			hi = Max(hi, idv[j]);
			ok[j] = false;
			c++;
		}
	values[0] = Int32GetDatum(qid);
	values[1] = TimestampTzGetDatum(now);
	values[2] = Int64GetDatum(lo);
	values[3] = Int64GetDatum(hi);
	values[4] = PointerGetDatum(construct_array(di, c, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	values[5] = PointerGetDatum(construct_array(da, c, INT4OID, 4, true, TYPALIGN_INT));
	values[6] = PointerGetDatum(construct_array(de, c, TIMESTAMPTZOID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	if (any_result)
	{
		int			dims[1] = {c};
		int			lbs[1] = {1};

		values[7] = PointerGetDatum(construct_md_array(dr, drn, 1, dims, lbs, JSONBOID, -1,
													   false, TYPALIGN_INT));
	}
	else
		nulls[7] = true;
	pgjq_history_insert_done(values, nulls);
	for (int k = 0; k < c; k++)
		pgjq_wait_note_finished(DatumGetInt64(di[k]), PGJQ_FINISHED_COMPLETED);
	if (pgjq_jobs_finished_hook)
		pgjq_jobs_finished_hook(qid, PGJQ_FINISHED_COMPLETED, c);

	/* limits.c counted them at their claim: per key, for key limits */
	if (pgjq_left_running_hook)
	{
		qsort(kh, c, sizeof(uint64), u64_cmp);
		for (int a = 0, b; a < c; a = b)
		{
			for (b = a + 1; b < c && kh[b] == kh[a]; b++)
				;
			pgjq_left_running_hook(qid, NULL, kh[a], b - a);
		}
	}
}

/*
 * Complete (ids[i], tokens[i]) with results[i]: the claims closed, one 'd'
 * log row per token, and the history; returns how many completed (a pair
 * not in flight is stale, one whose cancellation was requested ends as
 * cancelled).
 */
int64
pgjq_ring_complete(int n, Datum *ids, Datum *tokens, const Datum *results,
				   const bool *result_nulls, TimestampTz now)
{
	bool	   *found = palloc(sizeof(bool) * n);
	int64	   *idv = palloc(sizeof(int64) * n);
	int64	   *tokv = palloc(sizeof(int64) * n);
	bool	   *ok = palloc(sizeof(bool) * n);
	RingFlight *fl = palloc(sizeof(RingFlight) * n);
	int			nok;

	if (ring == NULL)
	{
		for (int i = 0; i < n; i++)
			idv[i] = DatumGetInt64(ids[i]);
		ring_require_for_jobs(n, idv);
	}
	if (ring == NULL || !ring_ensure_ready(false))
		return 0;
	for (int i = 0; i < n; i++)
	{
		idv[i] = DatumGetInt64(ids[i]);
		tokv[i] = DatumGetInt64(tokens[i]);
		/* token 0 means "any" to ring_close_claims: never a real token */
		if (tokv[i] == 0)
			tokv[i] = -1;
	}
	if (!any_in_flight(n, idv))
		return 0;
	nok = ring_close_claims(n, idv, tokv, found, ok, fl, 0);
	if (nok == 0)
		return 0;
	complete_log(n, idv, tokv, ok, nok, fl, now);
	nok -= complete_cancelled(n, ok, fl, now);

	/* the history: one job_done row per queue */
	pgjq_history_ensure(now);
	for (int i = 0; i < n; i++)
		if (ok[i])
			complete_queue_done(i, n, idv, ok, fl, results, result_nulls, now);
	/* last: the slot's lock is not held while this waits for anyone */
	ring_client_truncate();
	return nok;
}

static PgjqPlan plan_queue_backoff = {
	"SELECT backoff_base, backoff_max FROM pgjq.queue WHERE queue_id = $1",
	1, {INT4OID}
};

/*
 * a retry or a snooze: the job's next attempt waits in pgjq.job; a job with
 * a dedup_key turns its anchor into that row (the key stays held)
 */
static PgjqPlan plan_fail_schedule_anchor = {
	"UPDATE pgjq.job SET state = 's', attempt = $5, max_attempts = $6, token = $7, run_at = $9,"
	"                    lease_until = NULL, worker = $10, last_error = $11, payload = $12,"
	"                    timeout = $13"
	" WHERE id = $1 AND state = 'n'",
	13, {INT8OID, INT4OID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, INTERVALOID}
};
static PgjqPlan plan_fail_schedule = {
	"INSERT INTO pgjq.job (id, queue_id, state, priority, fair_key, dedup_key, attempt,"
	"                      max_attempts, token, enqueued_at, run_at, lease_until, worker,"
	"                      last_error, cancel_requested, payload, timeout)"
	" VALUES ($1, $2, 's', $3, coalesce($4, ''), NULL, $5, $6, $7, $8, $9, NULL, $10, $11,"
	"         false, $12, $13)",
	13, {INT8OID, INT4OID, INT2OID, TEXTOID, INT4OID, INT4OID, INT8OID, TIMESTAMPTZOID,
	TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID, INTERVALOID}
};

/*
 * Decide the outcome of a failed attempt of a running job (fail, the failed
 * outcomes of complete_and_claim, and rescue): cancelled if its cancellation
 * was requested, dead when its attempts are spent, else a retry at *run_at,
 * after retry_in_us (or the queue's backoff when negative).  Returns the
 * final state character, or 's' for a retry.  Only the decision: the engine
 * applies it under its own fencing (pgjq_ring_fail, below).
 */
static char
outcome_decide(const PgjqRunningJob *job, int64 retry_in_us, TimestampTz now,
			   TimestampTz *run_at)
{
	if (job->cancel_requested)
		return PGJQ_FINISHED_CANCELLED;
	if (job->attempt >= job->max_attempts)
		return PGJQ_FINISHED_DEAD;
	if (retry_in_us < 0)
		retry_in_us = pgjq_backoff_us(job->backoff_base_us, job->backoff_max_us, job->attempt);
	*run_at = now + retry_in_us;
	return 's';
}

/*
 * fail, snooze and rescue of a ring job in flight, without moving it first:
 * the claim is closed (one 'f' log row) and the job written once where it
 * goes, a scheduled row of pgjq.job (retry or snooze: promotion appends it
 * to the ring again when it is due) or the history (dead, or cancelled when
 * its cancellation was requested).  snooze_until != 0: a snooze (the
 * attempt is given back, the error kept); else a failure with error,
 * decided by outcome_decide (retry_in_us < 0: the queue's backoff).
 * lease_before != 0 (rescue): only if the lease still ends before it.
 * Returns PGJQ_RING_NOT_MINE, PGJQ_RING_STALE, or PGJQ_RING_FAILED with
 * *outcome ('s' scheduled, PGJQ_FINISHED_DEAD or PGJQ_FINISHED_CANCELLED)
 * and for 's' *run_at.
 */
int
pgjq_ring_fail(int64 id, int64 token, const char *error, int64 retry_in_us,
			   TimestampTz snooze_until, TimestampTz lease_before, TimestampTz now,
			   char *outcome, TimestampTz *run_at)
{
	bool		found,
				ok;
	RingFlight	f;
	int64		tok = token == 0 ? -1 : token;
	BodyRow		b;
	char	   *worker;
	int32		attempt;
	Datum		last_error;
	char		r;

	if (!maybe_in_flight(id))
		return PGJQ_RING_NOT_MINE;
	(void) ring_close_claims(1, &id, &tok, &found, &ok, &f, lease_before);
	if (!found)
		return PGJQ_RING_NOT_MINE;
	if (!ok)
		return PGJQ_RING_STALE;

	ring_closed_body(&f, &b, &worker);
	if (snooze_until != 0)
	{
		r = f.cancel_requested ? PGJQ_FINISHED_CANCELLED : 's';
		*run_at = snooze_until;
		attempt = b.attempt - 1;
		last_error = b.last_error;
	}
	else
	{
		PgjqRunningJob job;
		Datum		qv[1] = {Int32GetDatum(b.queue_id)};
		bool		isnull;

		pgjq_spi_run(&plan_queue_backoff, qv, NULL, 1);
		job.id = id;
		job.token = f.token;
		job.attempt = b.attempt;
		job.max_attempts = b.max_attempts;
		job.cancel_requested = f.cancel_requested;
		job.backoff_base_us = SPI_processed == 0 ? 0 :
			pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(0, 1, &isnull)));
		job.backoff_max_us = SPI_processed == 0 ? 0 :
			pgjq_interval_usec(DatumGetIntervalP(pgjq_spi_get(0, 2, &isnull)));
		r = outcome_decide(&job, retry_in_us, now, run_at);
		attempt = b.attempt;
		last_error = error ? CStringGetTextDatum(error) : b.last_error;
	}
	/* a cancelled snooze keeps the attempt it ran, as pgjq.job's */
	if (r == PGJQ_FINISHED_CANCELLED)
		attempt = b.attempt;
	ring_log_append(f.token, now, 'f', &id, 1);
	if (r == 's')
	{
		Datum		values[13];
		char		nulls[14] = "             ";

		values[0] = Int64GetDatum(id);
		values[1] = Int32GetDatum(b.queue_id);
		values[2] = Int16GetDatum(b.priority);
		values[3] = b.fair_key;
		nulls[3] = b.fair_key ? ' ' : 'n';
		values[4] = Int32GetDatum(attempt);
		values[5] = Int32GetDatum(b.max_attempts);
		values[6] = Int64GetDatum(f.token);
		values[7] = TimestampTzGetDatum(b.enqueued_at);
		values[8] = TimestampTzGetDatum(*run_at);
		values[9] = worker ? CStringGetTextDatum(worker) : (Datum) 0;
		nulls[9] = worker ? ' ' : 'n';
		values[10] = last_error;
		nulls[10] = last_error ? ' ' : 'n';
		values[11] = b.payload;
		values[12] = b.timeout_us > 0 ? pgjq_interval_datum(b.timeout_us) : (Datum) 0;
		nulls[12] = b.timeout_us > 0 ? ' ' : 'n';
		pgjq_spi_run(f.anchored ? &plan_fail_schedule_anchor : &plan_fail_schedule,
					 values, nulls, 0);
		if (SPI_processed != 1)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("pgjq ring: the dedup anchor of job " INT64_FORMAT " is missing", id)));
	}
	else
		ring_history_one(&b, r, attempt, f.token, worker, last_error, now);
	left_running(&f);
	*outcome = r;
	return PGJQ_RING_FAILED;
}

static PgjqPlan plan_queue_lease = {
	"SELECT $2 + q.lease FROM pgjq.queue q WHERE q.queue_id = $1",
	2, {INT4OID, TIMESTAMPTZOID}, NULL, true
};

/*
 * End (id, token), a ring job in flight whose cancellation was requested,
 * as cancelled (heartbeat's way of answering it).  False if it was not
 * closed here (stale meanwhile).
 */
static bool
finish_cancelled(int64 id, int64 token, TimestampTz now)
{
	bool		found,
				ok;
	RingFlight	f;
	BodyRow		b;
	char	   *worker;

	(void) ring_close_claims(1, &id, &token, &found, &ok, &f, 0);
	if (!ok)
		return false;
	ring_closed_body(&f, &b, &worker);
	ring_log_append(f.token, now, 'x', &id, 1);
	ring_history_one(&b, PGJQ_FINISHED_CANCELLED, b.attempt, f.token, worker, b.last_error, now);
	left_running(&f);
	return true;
}

/*
 * Heartbeat of a ring job in flight: the entry becomes EXTENDING (rescue and
 * the other outcomes of its claim wait for this transaction) and takes the
 * new lease when this commits; one 'h' log row (token, new lease, id) makes
 * it durable.  Nothing moves, nothing is updated.  A job whose cancellation
 * was requested ends as cancelled instead (PGJQ_RING_CANCELLED).
 */
int
pgjq_ring_heartbeat(int64 id, int64 token, int64 extend_us, TimestampTz now,
					TimestampTz *lease_until)
{
	TransactionId xid;
	RingFlight *f;
	int32		queue_id = 0;
	int			r = PGJQ_RING_NOT_MINE;

	if (!maybe_in_flight(id))
		return PGJQ_RING_NOT_MINE;

	/* the queue's lease, read before the lock (it is no lock-held work) */
	if (extend_us < 0)
	{
		LWLockAcquire(ring->lock, LW_SHARED);
		f = ring_flight_find(id);
		if (f != NULL)
			queue_id = f->queue_id;
		LWLockRelease(ring->lock);
		if (f == NULL)
			return PGJQ_RING_NOT_MINE;
	}
	if (extend_us >= 0)
		*lease_until = now + extend_us;
	else
	{
		Datum		values[2] = {Int32GetDatum(queue_id), TimestampTzGetDatum(now)};
		bool		isnull;

		pgjq_spi_run(&plan_queue_lease, values, NULL, 1);
		if (SPI_processed == 0)
			return PGJQ_RING_NOT_MINE;	/* its queue was dropped: cannot be */
		*lease_until = DatumGetTimestampTz(pgjq_spi_get(0, 1, &isnull));
	}

	xid = GetTopTransactionId();
	ring_reserve_extended();
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	f = flight_settled(id, token, xid);
	if (f == NULL || (f->state == RF_CLOSING && f->xid == xid))
		r = PGJQ_RING_NOT_MINE; /* as ring_close_claims: stale */
	else if (f->token != token)
		r = PGJQ_RING_STALE;
	else if (f->cancel_requested)
		r = PGJQ_RING_CANCELLED;
	else if (f->deadline != 0 && now >= f->deadline)
		r = PGJQ_RING_TIMED_OUT;
	else
	{
		bool		was_open = f->state == RF_OPEN;

		if (f->deadline != 0)
			*lease_until = Min(*lease_until, f->deadline);

		Assert(was_open || f->xid == xid);
		ring_note_extended(id, token, *lease_until, was_open, false);
		if (was_open)
		{
			f->state = RF_EXTENDING;
			f->xid = xid;
		}
		r = PGJQ_RING_EXTENDED;
	}
	LWLockRelease(ring->lock);
	if (r == PGJQ_RING_EXTENDED)
		ring_log_append(token, *lease_until, 'h', &id, 1);
	else if (r == PGJQ_RING_CANCELLED && !finish_cancelled(id, token, now))
		r = PGJQ_RING_STALE;
	return r;
}

/*
 * cancel() of a ring job in flight: its cancellation is requested (one 'q'
 * log row; the entry takes it when this commits, EXTENDING until then), and
 * its holder's next outcome or heartbeat ends it as cancelled.  False if id
 * is no ring job in flight.
 */
bool
pgjq_ring_request_cancel(int64 id)
{
	TransactionId xid;
	RingFlight *f;
	int64		token = 0;
	bool		mine = false;

	if (!maybe_in_flight(id))
		return false;
	xid = GetTopTransactionId();
	ring_reserve_extended();
	LWLockAcquire(ring->lock, LW_EXCLUSIVE);
	f = flight_settled(id, 0, xid);
	/* one this transaction closed is no ring job for it (ring_close_claims) */
	if (f != NULL && !(f->state == RF_CLOSING && f->xid == xid))
	{
		bool		was_open = f->state == RF_OPEN;

		mine = true;
		token = f->token;
		if (!f->cancel_requested)
		{
			ring_note_extended(id, token, f->lease_until, was_open, true);
			if (was_open)
			{
				f->state = RF_EXTENDING;
				f->xid = xid;
			}
		}
		else
			token = 0;			/* requested before: nothing to write */
	}
	LWLockRelease(ring->lock);
	if (token != 0)
		ring_log_append(token, GetCurrentTimestamp(), 'q', &id, 1);
	return mine;
}

int
pgjq_ring_expired(TimestampTz now, int limit, int64 *ids, int64 *tokens)
{
	HASH_SEQ_STATUS hs;
	RingFlight *f;
	int			n = 0;

	if (ring == NULL || !ring_ensure_ready(false))
		return 0;
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
	{
		if (f->key.dbid != MyDatabaseId || f->state != RF_OPEN || f->lease_until >= now)
			continue;
		ids[n] = f->key.id;
		tokens[n] = f->token;
		if (++n >= limit)
		{
			hash_seq_term(&hs);
			break;
		}
	}
	LWLockRelease(ring->lock);
	return n;
}

bool
pgjq_ring_job_key(int64 id, int64 token, int32 *queue_id, char **fair_key)
{
	RingFlight *f;
	ItemPointerData tid;
	int			slot = -1;
	Relation	rel;
	BodyRow		b;

	if (ring == NULL || !maybe_in_flight(id))
		return false;
	LWLockAcquire(ring->lock, LW_SHARED);
	f = ring_flight_find(id);
	if (f != NULL && f->token == token)
	{
		*queue_id = f->queue_id;
		tid = f->tid;
		slot = f->slot;
	}
	LWLockRelease(ring->lock);
	if (slot < 0)
		return false;
	rel = table_open(ring_body_oid[slot], AccessShareLock);
	ring_body_fetch(rel, id, &tid, &b);
	table_close(rel, NoLock);
	*fair_key = b.fair_key ? TextDatumGetCString(b.fair_key) : "";
	return true;
}

TimestampTz
pgjq_ring_deadline(int64 id, int64 token)
{
	RingFlight *f;
	TimestampTz d = 0;

	if (ring == NULL || !maybe_in_flight(id))
		return 0;
	LWLockAcquire(ring->lock, LW_SHARED);
	f = ring_flight_find(id);
	if (f != NULL && f->token == token)
		d = f->deadline;
	LWLockRelease(ring->lock);
	return d;
}

TimestampTz
pgjq_ring_next_deadline(void)
{
	HASH_SEQ_STATUS hs;
	RingFlight *f;
	TimestampTz next = DT_NOEND;

	if (ring == NULL || !ring_ensure_ready(false))
		return next;
	LWLockAcquire(ring->lock, LW_SHARED);
	hash_seq_init(&hs, ring_flights);
	while ((f = hash_seq_search(&hs)) != NULL)
		if (f->key.dbid == MyDatabaseId && f->state != RF_CLOSING &&
			f->state != RF_EXTENDING && f->lease_until < next &&
			f->lease_until != 0)
			next = f->lease_until;
	LWLockRelease(ring->lock);
	return next;
}
