/*-------------------------------------------------------------------------
 *
 * metric_counters.c
 *	  Per-queue counters and histograms in shared memory, with each
 *	  backend's pending counts of its open transaction: what the API layer
 *	  reports as it enqueues, claims and applies outcomes, and what
 *	  pgjq.metrics() (api/metrics.c) copies out to show.
 *
 * Counters: a fixed-size shared hash (pgjq.max_metrics_queues entries) maps
 * (database, queue) to its counters and two histograms (claim wait, job run
 * time).  Queue 0 of a database collects what no queue can be named for (a
 * stale token claimed before the ring below remembers).  When the hash is
 * full, a new queue's counts go to one overflow counter: never an error,
 * never silent.  The entries of a dropped queue go when drop_queue commits.
 * Nothing here writes to a table or to WAL.
 *
 * Order of operations: pgjq.c's shmem hooks size and attach the hash and
 * the claim ring; each pgjq call enters the storage engine first
 * (pgjq_metrics_storage_begin notes the extension's incarnation), then the
 * API layer reports what it did as it goes (pgjq_metrics_count, _claimed,
 * _job_outcome, ...) and the engine's events arrive through the hooks
 * pgjq.c wires; the counts wait in this backend until the transaction
 * ends; metrics() copies the entries out (pgjq_metrics_copy_entries).
 *
 * Transactions: the counts wait in this backend (pending[], each tagged
 * with its subtransaction level) and are applied when the transaction
 * commits, in the commit callback, which takes the lock once and neither
 * allocates nor fails.  An abort drops them, a subtransaction abort drops
 * its own; PREPARE drops them too (a prepared transaction's outcome happens
 * elsewhere).  So a rolled-back claim or complete is not counted.
 *
 * Run time: when a claim commits, its fencing token, queue and claim time go
 * into a ring of pgjq.max_metrics_claims slots (slot = token modulo the
 * size, so newer claims overwrite older ones).  An outcome looks its token
 * up there (and in this transaction's own pending claims); a token no
 * longer there counts as pgjq_job_run_unknown_total instead of a run time.
 *
 * Queue attribution: claims, enqueues and held-back claims are reported
 * with their queue.  Final states (completed, dead, cancelled) come from
 * the storage engine's jobs-finished hook with the queue of each job
 * (pgjq_metrics_jobs_finished).  Retries, snoozes and rescues take the
 * queue of the job that left the running state during the call (the
 * left-running hook, chained after limits.c's: pgjq_metrics_left_running);
 * pgjq_metrics_call_begin() starts such a call.  pgjq.c sets those hooks:
 * this layer does not see the engine.
 *
 * Locking: metrics_lock (one LWLock of the "pgjq" tranche, number 3) guards
 * the hash, the ring and the overflow counter; it is held for hash
 * operations only, and nothing else of pgjq's is taken under it.
 *
 *-------------------------------------------------------------------------
 */
#include "state/metric_counters.h"
#include "common/guc.h"

#include "access/xact.h"
#include "catalog/namespace.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define NBUCKETS PGJQ_METRICS_NBUCKETS

/* The bucket bounds, and the same as the text of the le label. */
const double pgjq_metrics_bucket_le[NBUCKETS] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};
const char *const pgjq_metrics_bucket_label[NBUCKETS] = {"0.001", "0.005", "0.01", "0.05", "0.1",
"0.5", "1", "5", "10"};

typedef struct ClaimSlot
{
	int64		token;			/* 0: empty */
	Oid			dboid;
	Oid			incarnation;
	int32		queue_id;
	TimestampTz at;
} ClaimSlot;

typedef struct MetricsShared
{
	LWLock	   *lock;
	uint64		overflow;		/* counts of queues that found no entry */
	int			nclaims;
	ClaimSlot	claims[FLEXIBLE_ARRAY_MEMBER];
} MetricsShared;

static MetricsShared *shared = NULL;
static HTAB *queues = NULL;

/* This backend's counts of its open transaction. */
typedef enum PendingKind
{
	PK_COUNT,
	PK_WAIT,
	PK_RUN,
	PK_CLAIM,
	PK_DROP
} PendingKind;

typedef struct PendingMetric
{
	PendingKind kind;
	int			level;			/* subtransaction nesting level */
	Oid			incarnation;
	int32		queue_id;
	int			counter;		/* PK_COUNT */
	int64		n;				/* PK_COUNT */
	PgjqMetricsHist hist;		/* PK_WAIT, PK_RUN */
	int64		token;			/* PK_CLAIM */
	TimestampTz at;				/* PK_CLAIM */
} PendingMetric;

static PendingMetric *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks_registered = false;

/* The current call (see pgjq_metrics_call_begin). */
static int32 call_queue = -1;	/* -1: none yet; 0: several */
static int64 call_finished = 0;

/* The incarnation of the extension the current call works in. */
static Oid	incarnation = InvalidOid;

static void xact_callback(XactEvent event, void *arg);
static void subxact_callback(SubXactEvent event, SubTransactionId mySubid,
							 SubTransactionId parentSubid, void *arg);

static Size
shared_size(void)
{
	return add_size(offsetof(MetricsShared, claims),
					mul_size(pgjq_max_metrics_claims, sizeof(ClaimSlot)));
}

Size
pgjq_metrics_shmem_size(void)
{
	return add_size(MAXALIGN(shared_size()),
					hash_estimate_size(pgjq_max_metrics_queues, sizeof(PgjqQueueMetrics)));
}

/* From pgjq.c's shmem startup hook, holding AddinShmemInitLock. */
void
pgjq_metrics_shmem_init(bool found)
{
	HASHCTL		info;
	bool		sfound;

	shared = ShmemInitStruct("pgjq metrics", shared_size(), &sfound);
	if (!sfound)
	{
		memset(shared, 0, shared_size());
		shared->lock = &(GetNamedLWLockTranche("pgjq"))[3].lock;
		shared->nclaims = pgjq_max_metrics_claims;
	}
	memset(&info, 0, sizeof(info));
	info.keysize = sizeof(PgjqMetricsKey);
	info.entrysize = sizeof(PgjqQueueMetrics);
	/* never take from the shared reserve: a full table counts overflow */
	queues = ShmemInitHash("pgjq metrics queues", pgjq_max_metrics_queues,
						   pgjq_max_metrics_queues, &info,
						   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/*
 * Chained after limits.c's (by pgjq.c): the queue of the job that left the
 * running state, for the call's retry, snooze or rescue.
 */
void
pgjq_metrics_left_running(int32 queue_id)
{
	if (call_queue == -1)
		call_queue = queue_id;
	else if (call_queue != queue_id)
		call_queue = 0;
}

/*
 * The engine's jobs-finished hook (set by pgjq.c): n jobs of the queue
 * reached a final state, counted as m (PGJQ_M_COMPLETED, _DEAD or
 * _CANCELLED; PGJQ_M_NCOUNTERS for a state counted nowhere).
 */
void
pgjq_metrics_jobs_finished(int32 queue_id, PgjqMetric m, int n)
{
	if (m != PGJQ_M_NCOUNTERS)
		pgjq_metrics_count(queue_id, m, n);
	call_finished += n;
	if (call_queue == -1)
		call_queue = queue_id;
	else if (call_queue != queue_id)
		call_queue = 0;
}

/*
 * Every pgjq call enters the storage engine before it reports anything
 * (its begin hook, set by pgjq.c after limits.c's): note which incarnation
 * of the extension its counts belong to (after DROP and CREATE EXTENSION,
 * queue ids and tokens start again).
 */
void
pgjq_metrics_storage_begin(void)
{
	incarnation = get_relname_relid("job", get_namespace_oid("pgjq", true));
}

/* ---------------------------------------------------------------- pending */

static void
register_callbacks(void)
{
	if (callbacks_registered)
		return;
	RegisterXactCallback(xact_callback, NULL);
	RegisterSubXactCallback(subxact_callback, NULL);
	callbacks_registered = true;
}

/*
 * The pending entry of this kind, queue and counter at the current level,
 * merged with a recent one when there is one, else a new zeroed one.
 */
static PendingMetric *
pending_entry(PendingKind kind, int32 queue_id, int counter)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingMetric *p;

	register_callbacks();
	if (kind != PK_CLAIM)
		for (int i = npending - 1; i >= 0 && i >= npending - 32; i--)
		{
			p = &pending[i];
			if (p->kind == kind && p->queue_id == queue_id && p->counter == counter &&
				p->level == level && p->incarnation == incarnation)
				return p;
		}
	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, sizeof(PendingMetric) * newmax);
		else
			pending = repalloc(pending, sizeof(PendingMetric) * newmax);
		maxpending = newmax;
	}
	p = &pending[npending++];
	memset(p, 0, sizeof(PendingMetric));
	p->kind = kind;
	p->level = level;
	p->incarnation = incarnation;
	p->queue_id = queue_id;
	p->counter = counter;
	return p;
}

static void
hist_add(PgjqMetricsHist *h, double seconds)
{
	int			b = 0;

	if (seconds < 0)
		seconds = 0;
	while (b < NBUCKETS && seconds > pgjq_metrics_bucket_le[b])
		b++;
	h->buckets[b]++;
	h->count++;
	h->sum += seconds;
}

static void
hist_merge(PgjqMetricsHist *into, const PgjqMetricsHist *from)
{
	for (int b = 0; b <= NBUCKETS; b++)
		into->buckets[b] += from->buckets[b];
	into->count += from->count;
	into->sum += from->sum;
}

/* Count n events of counter m for the queue (0: no queue known). */
void
pgjq_metrics_count(int32 queue_id, PgjqMetric m, int64 n)
{
	if (shared == NULL || n <= 0)
		return;
	pending_entry(PK_COUNT, queue_id, m)->n += n;
}

/* A claim of n jobs with this token; the token is remembered at commit. */
void
pgjq_metrics_claimed(int32 queue_id, int n, int64 token, TimestampTz at)
{
	PendingMetric *p;

	if (shared == NULL || n <= 0)
		return;
	pgjq_metrics_count(queue_id, PGJQ_M_CLAIMED, n);
	p = pending_entry(PK_CLAIM, queue_id, 0);
	p->token = token;
	p->at = at;
}

/* A claim of the queue that waited for us microseconds. */
void
pgjq_metrics_waited(int32 queue_id, int64 us)
{
	if (shared == NULL)
		return;
	hist_add(&pending_entry(PK_WAIT, queue_id, 0)->hist, (double) us / USECS_PER_SEC);
}

/* Drop the queue's counters when the transaction commits (drop_queue). */
void
pgjq_metrics_queue_dropped(int32 queue_id)
{
	if (shared == NULL)
		return;
	(void) pending_entry(PK_DROP, queue_id, 0);
}

/* ------------------------------------------------------------ claim ring */

/*
 * Where and when the token was claimed: this transaction's pending claims
 * first, then the ring.  Caller holds the lock (shared) when ring_locked.
 */
static bool
token_lookup(int64 token, int32 *queue_id, TimestampTz *at)
{
	ClaimSlot  *slot;

	for (int i = npending - 1; i >= 0; i--)
		if (pending[i].kind == PK_CLAIM && pending[i].token == token)
		{
			*queue_id = pending[i].queue_id;
			*at = pending[i].at;
			return true;
		}
	if (token <= 0)
		return false;
	slot = &shared->claims[token % shared->nclaims];
	if (slot->token != token || slot->dboid != MyDatabaseId ||
		slot->incarnation != incarnation)
		return false;
	*queue_id = slot->queue_id;
	*at = slot->at;
	return true;
}

/* Start of an outcome call: forget the queues the previous one saw. */
void
pgjq_metrics_call_begin(void)
{
	call_queue = -1;
	call_finished = 0;
}

/* The queue the call's engine events named, 0 if none or several. */
static int32
call_queue_id(void)
{
	return call_queue > 0 ? call_queue : 0;
}

static void
observe_run(int32 queue_id, TimestampTz at, TimestampTz now)
{
	hist_add(&pending_entry(PK_RUN, queue_id, 0)->hist, (double) (now - at) / USECS_PER_SEC);
}

/*
 * A running job (token) reached an outcome in this call: counter m unless
 * m is PGJQ_M_NCOUNTERS (final states are counted by the engine's hook),
 * and its run time.
 */
void
pgjq_metrics_job_outcome(int64 token, PgjqMetric m, TimestampTz now)
{
	int32		queue_id;
	TimestampTz at;
	bool		found;

	if (shared == NULL)
		return;
	if (m != PGJQ_M_NCOUNTERS)
		pgjq_metrics_count(call_queue_id(), m, 1);
	LWLockAcquire(shared->lock, LW_SHARED);
	found = token_lookup(token, &queue_id, &at);
	LWLockRelease(shared->lock);
	if (found)
		observe_run(queue_id, at, now);
	else
		pgjq_metrics_count(call_queue_id(), PGJQ_M_RUN_UNKNOWN, 1);
}

/* The queue a stale token was claimed from, or 0. */
static int32
stale_queue(int64 token)
{
	int32		queue_id = 0;
	TimestampTz at;

	if (!token_lookup(token, &queue_id, &at))
		queue_id = 0;
	return queue_id;
}

/* n outcomes whose (id, token) no longer matched a running job. */
void
pgjq_metrics_stale(int n, const Datum *tokens)
{
	if (shared == NULL)
		return;
	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < n; i++)
		pgjq_metrics_count(stale_queue(DatumGetInt64(tokens[i])), PGJQ_M_STALE, 1);
	LWLockRelease(shared->lock);
}

/*
 * After complete of n (id, token) pairs in this call: the engine's hook
 * counted the jobs that ended (completed or cancelled); the rest were
 * stale.  Which pairs were stale is known only when there are none or all
 * pairs share one token (a claim's batch): then each ended job gets its run
 * time; otherwise the ended ones count as run-time unknown.
 */
void
pgjq_metrics_completed(int n, const Datum *tokens, int64 done, TimestampTz now)
{
	int64		ended = call_finished;
	int64		stale = n - ended;
	bool		one_token = true;
	int32	   *qids;
	TimestampTz *ats;
	bool	   *found;
	int			nlook;

	if (shared == NULL || n <= 0)
		return;
	for (int i = 1; i < n && one_token; i++)
		one_token = DatumGetInt64(tokens[i]) == DatumGetInt64(tokens[0]);
	nlook = one_token ? 1 : n;
	qids = palloc(sizeof(int32) * nlook);
	ats = palloc(sizeof(TimestampTz) * nlook);
	found = palloc(sizeof(bool) * nlook);
	LWLockAcquire(shared->lock, LW_SHARED);
	for (int i = 0; i < nlook; i++)
		found[i] = token_lookup(DatumGetInt64(tokens[i]), &qids[i], &ats[i]);
	LWLockRelease(shared->lock);

	if (stale > 0)
		pgjq_metrics_count(one_token && found[0] ? qids[0] : 0, PGJQ_M_STALE, stale);
	if (ended <= 0)
		return;
	if (one_token)
	{
		/* one claim's batch: all ended jobs ran equally long */
		for (int64 i = 0; i < ended; i++)
		{
			if (found[0])
				observe_run(qids[0], ats[0], now);
			else
				pgjq_metrics_count(call_queue_id(), PGJQ_M_RUN_UNKNOWN, 1);
		}
	}
	else if (stale > 0)
		pgjq_metrics_count(call_queue_id(), PGJQ_M_RUN_UNKNOWN, ended);
	else
		for (int i = 0; i < n; i++)
		{
			if (found[i])
				observe_run(qids[i], ats[i], now);
			else
				pgjq_metrics_count(call_queue_id(), PGJQ_M_RUN_UNKNOWN, 1);
		}
}

/* ------------------------------------------------------ commit and abort */

/* Apply every pending count; the commit callback's part (no palloc, no error). */
static void
apply_pending(void)
{
	LWLockAcquire(shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < npending; i++)
	{
		PendingMetric *p = &pending[i];
		PgjqMetricsKey key;
		PgjqQueueMetrics *e;
		bool		found;

		if (p->kind == PK_CLAIM)
		{
			ClaimSlot  *slot;

			if (p->token <= 0)
				continue;
			slot = &shared->claims[p->token % shared->nclaims];
			slot->token = p->token;
			slot->dboid = MyDatabaseId;
			slot->incarnation = p->incarnation;
			slot->queue_id = p->queue_id;
			slot->at = p->at;
			continue;
		}
		memset(&key, 0, sizeof(key));
		key.dboid = MyDatabaseId;
		key.incarnation = p->incarnation;
		key.queue_id = p->queue_id;
		if (p->kind == PK_DROP)
		{
			(void) hash_search(queues, &key, HASH_REMOVE, NULL);
			continue;
		}
		e = hash_search(queues, &key, HASH_ENTER_NULL, &found);
		if (e == NULL)
		{
			shared->overflow += p->kind == PK_COUNT ? (uint64) p->n : p->hist.count;
			continue;
		}
		if (!found)
		{
			memset(e->counters, 0, sizeof(e->counters));
			memset(&e->wait, 0, sizeof(e->wait));
			memset(&e->run, 0, sizeof(e->run));
		}
		switch (p->kind)
		{
			case PK_COUNT:
				e->counters[p->counter] += (uint64) p->n;
				break;
			case PK_WAIT:
				hist_merge(&e->wait, &p->hist);
				break;
			case PK_RUN:
				hist_merge(&e->run, &p->hist);
				break;
			default:
				break;
		}
	}
	LWLockRelease(shared->lock);
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			if (npending > 0 && shared != NULL)
				apply_pending();
			npending = 0;
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			npending = 0;
			break;
		default:
			break;
	}
	call_queue = -1;
	call_finished = 0;
}

static void
subxact_callback(SubXactEvent event, SubTransactionId mySubid,
				 SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	int			kept = 0;

	switch (event)
	{
		case SUBXACT_EVENT_ABORT_SUB:
			for (int i = 0; i < npending; i++)
				if (pending[i].level < level)
					pending[kept++] = pending[i];
			npending = kept;
			break;
		case SUBXACT_EVENT_COMMIT_SUB:
			for (int i = 0; i < npending; i++)
				if (pending[i].level >= level)
					pending[i].level = level - 1;
			break;
		default:
			break;
	}
}

/* ------------------------------------------------------------- reading */

/* Whether the counters exist (pgjq is in shared_preload_libraries). */
bool
pgjq_metrics_available(void)
{
	return shared != NULL;
}

/*
 * This database's entries (of queue `only` when not 0), copied out under
 * the lock into *entries (palloc'd; NULL without counters), in no order;
 * *overflow gets the overflow counter.  Entries of an earlier CREATE
 * EXTENSION in this database are freed on the way.  Returns their number.
 */
int
pgjq_metrics_copy_entries(int32 only, PgjqQueueMetrics **entries, uint64 *overflow)
{
	HASH_SEQ_STATUS scan;
	PgjqQueueMetrics *e;
	PgjqQueueMetrics *qm;
	int			nqm = 0;
	long		cap = 64;

	*entries = NULL;
	*overflow = 0;
	if (shared == NULL)
		return 0;

	/* room for every entry: sized under the lock, grown outside it */
	qm = palloc(sizeof(PgjqQueueMetrics) * cap);
	for (;;)
	{
		LWLockAcquire(shared->lock, LW_EXCLUSIVE);
		if (hash_get_num_entries(queues) <= cap)
			break;
		cap = hash_get_num_entries(queues) + 64;
		LWLockRelease(shared->lock);
		qm = repalloc(qm, sizeof(PgjqQueueMetrics) * cap);
	}
	*overflow = shared->overflow;
	hash_seq_init(&scan, queues);
	while ((e = hash_seq_search(&scan)) != NULL)
	{
		/* entries of an earlier CREATE EXTENSION here: free them */
		if (e->key.dboid == MyDatabaseId && e->key.incarnation != incarnation)
		{
			(void) hash_search(queues, &e->key, HASH_REMOVE, NULL);
			continue;
		}
		if (e->key.dboid != MyDatabaseId ||
			(only != 0 && e->key.queue_id != only))
			continue;
		qm[nqm++] = *e;
	}
	LWLockRelease(shared->lock);
	*entries = qm;
	return nqm;
}
