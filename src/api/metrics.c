/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  Per-queue counters and histograms in shared memory, and the SQL
 *	  functions metrics() and metrics_prometheus() that show them with the
 *	  gauges read from the tables (storage_metrics.c), the worker's passes
 *	  (shmem.c) and the vacuum horizon (horizon.c's health()).
 *
 * Counters: a fixed-size shared hash (pgjq.max_metrics_queues entries) maps
 * (database, queue) to its counters and two histograms (claim wait, job run
 * time).  Queue 0 of a database collects what no queue can be named for (a
 * stale token claimed before the ring below remembers).  When the hash is
 * full, a new queue's counts go to one overflow counter: never an error,
 * never silent.  The entries of a dropped queue go when drop_queue commits.
 * Nothing here writes to a table or to WAL.
 *
 * Transactions: the API layer reports what it did as it goes; the counts
 * wait in this backend (pending[], each tagged with its subtransaction
 * level) and are applied when the transaction commits, in the commit
 * callback, which takes the lock once and neither allocates nor fails.  An
 * abort drops them, a subtransaction abort drops its own; PREPARE drops
 * them too (a prepared transaction's outcome happens elsewhere).  So a
 * rolled-back claim or complete is not counted.
 *
 * Run time: when a claim commits, its fencing token, queue and claim time go
 * into a ring of pgjq.max_metrics_claims slots (slot = token modulo the
 * size, so newer claims overwrite older ones).  An outcome looks its token
 * up there (and in this transaction's own pending claims); a token no
 * longer there counts as pgjq_job_run_unknown_total instead of a run time.
 *
 * Queue attribution: claims, enqueues and held-back claims are reported
 * with their queue.  Final states (completed, dead, cancelled) come from
 * the storage engine's jobs-finished hook with the queue of each job.
 * Retries, snoozes and rescues take the queue of the job that left the
 * running state during the call (the left-running hook, chained after
 * limits.c's); pgjq_metrics_call_begin() starts such a call.
 *
 * Locking: metrics_lock (one LWLock of the "pgjq" tranche) guards the hash,
 * the ring and the overflow counter; it is held for hash operations only.
 *
 *-------------------------------------------------------------------------
 */
#include "api/metrics.h"
#include "common/args.h"
#include "common/spi_plans.h"
#include "engine/engine.h"
#include "common/guc.h"
#include "state/worker_slots.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/namespace.h"
#include "commands/dbcommands.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

/* Histogram bucket upper bounds, in seconds; one more bucket for +Inf. */
#define NBUCKETS 9
static const double bucket_le[NBUCKETS] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10};
static const char *const bucket_label[NBUCKETS] = {"0.001", "0.005", "0.01", "0.05", "0.1",
"0.5", "1", "5", "10"};

typedef struct MetricsHist
{
	uint64		buckets[NBUCKETS + 1];	/* not cumulative; last: above 10 s */
	uint64		count;
	double		sum;			/* seconds */
} MetricsHist;

typedef struct MetricsKey
{
	Oid			dboid;
	Oid			incarnation;	/* OID of pgjq.job: a new CREATE EXTENSION
								 * starts over */
	int32		queue_id;		/* 0: no queue could be named */
} MetricsKey;

typedef struct QueueMetrics
{
	MetricsKey	key;
	uint64		counters[PGJQ_M_NCOUNTERS];
	MetricsHist wait;
	MetricsHist run;
} QueueMetrics;

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
	MetricsHist hist;			/* PK_WAIT, PK_RUN */
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

static PgjqLeftRunningHook prev_left_running_hook = NULL;
static PgjqJobsFinishedHook prev_jobs_finished_hook = NULL;
static PgjqStorageBeginHook prev_storage_begin_hook = NULL;

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
					hash_estimate_size(pgjq_max_metrics_queues, sizeof(QueueMetrics)));
}

/* From shmem.c's startup hook, holding AddinShmemInitLock. */
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
	info.keysize = sizeof(MetricsKey);
	info.entrysize = sizeof(QueueMetrics);
	/* never take from the shared reserve: a full table counts overflow */
	queues = ShmemInitHash("pgjq metrics queues", pgjq_max_metrics_queues,
						   pgjq_max_metrics_queues, &info,
						   HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
}

/*
 * Chained after limits.c's: the queue of the job that left the running
 * state, for the call's retry, snooze or rescue.
 */
static void
left_running(int32 queue_id, const char *fair_key, uint64 keyhash, int n)
{
	if (prev_left_running_hook)
		prev_left_running_hook(queue_id, fair_key, keyhash, n);
	if (call_queue == -1)
		call_queue = queue_id;
	else if (call_queue != queue_id)
		call_queue = 0;
}

static void
jobs_finished(int32 queue_id, char state, int n)
{
	if (prev_jobs_finished_hook)
		prev_jobs_finished_hook(queue_id, state, n);
	switch (state)
	{
		case PGJQ_FINISHED_COMPLETED:
			pgjq_metrics_count(queue_id, PGJQ_M_COMPLETED, n);
			break;
		case PGJQ_FINISHED_DEAD:
			pgjq_metrics_count(queue_id, PGJQ_M_DEAD, n);
			break;
		case PGJQ_FINISHED_CANCELLED:
			pgjq_metrics_count(queue_id, PGJQ_M_CANCELLED, n);
			break;
		default:
			break;
	}
	call_finished += n;
	if (call_queue == -1)
		call_queue = queue_id;
	else if (call_queue != queue_id)
		call_queue = 0;
}

/*
 * Every pgjq call enters the storage engine before it reports anything:
 * note which incarnation of the extension its counts belong to (after DROP
 * and CREATE EXTENSION, queue ids and tokens start again).
 */
static void
storage_begin(void)
{
	if (prev_storage_begin_hook)
		prev_storage_begin_hook();
	incarnation = get_relname_relid("job", get_namespace_oid("pgjq", true));
}

/* Per-backend setup when preloaded (from _PG_init via shmem.c). */
void
pgjq_metrics_startup(void)
{
	prev_storage_begin_hook = pgjq_storage_begin_hook;
	pgjq_storage_begin_hook = storage_begin;
	prev_left_running_hook = pgjq_left_running_hook;
	pgjq_left_running_hook = left_running;
	prev_jobs_finished_hook = pgjq_jobs_finished_hook;
	pgjq_jobs_finished_hook = jobs_finished;
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
hist_add(MetricsHist *h, double seconds)
{
	int			b = 0;

	if (seconds < 0)
		seconds = 0;
	while (b < NBUCKETS && seconds > bucket_le[b])
		b++;
	h->buckets[b]++;
	h->count++;
	h->sum += seconds;
}

static void
hist_merge(MetricsHist *into, const MetricsHist *from)
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
		MetricsKey	key;
		QueueMetrics *e;
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

/* A sample: one row of metrics(), one line of metrics_prometheus(). */
typedef struct Sample
{
	int			family;
	const char *suffix;			/* "", "_bucket", "_sum", "_count" */
	int			nlabels;
	const char *lname[3];
	const char *lvalue[3];
	double		value;
} Sample;

typedef enum FamilyType
{
	F_GAUGE,
	F_COUNTER,
	F_HISTOGRAM
} FamilyType;

typedef struct Family
{
	const char *name;
	FamilyType	type;
	const char *help;
} Family;

enum
{
	FAM_AVAILABLE,
	FAM_OVERFLOW,
	FAM_JOBS,
	FAM_OLDEST_READY,
	FAM_NEXT_SCHEDULED,
	FAM_HELD_KEYS,
	FAM_COUNTERS,				/* PGJQ_M_NCOUNTERS families from here */
	FAM_WAIT = FAM_COUNTERS + PGJQ_M_NCOUNTERS - 4, /* the five held-back
													 * counters are one family */
	FAM_RUN,
	FAM_WORKER_PASS_AT,
	FAM_WORKER_PASS_DURATION,
	FAM_HORIZON_SECONDS,
	FAM_HORIZON_XACTS,
	NFAMILIES
};

static const Family families[NFAMILIES] = {
	{"pgjq_counters_available", F_GAUGE,
	"1 when pgjq is in shared_preload_libraries and its counters exist, 0 when they are absent"},
	{"pgjq_metrics_overflow_total", F_COUNTER,
	"Counts that found no free entry (pgjq.max_metrics_queues) and are not in any queue's counters"},
	{"pgjq_jobs", F_GAUGE, "Jobs of the queue in each state (ready, scheduled, running, dead, waiting)"},
	{"pgjq_oldest_ready_age_seconds", F_GAUGE, "Age of the queue's oldest ready job (since it became due)"},
	{"pgjq_next_scheduled_seconds", F_GAUGE, "Seconds until the queue's next scheduled job is due (negative: overdue)"},
	{"pgjq_held_keys", F_GAUGE, "Fair keys of the queue held by hold_key() or fail(..., hold_key_for), until a time still ahead"},
	{"pgjq_jobs_enqueued_total", F_COUNTER, "Jobs enqueued (a duplicate merged by dedup_key counts too)"},
	{"pgjq_jobs_claimed_total", F_COUNTER, "Jobs claimed"},
	{"pgjq_jobs_completed_total", F_COUNTER, "Jobs completed"},
	{"pgjq_jobs_failed_total", F_COUNTER, "Failed attempts that were scheduled for a retry"},
	{"pgjq_jobs_dead_total", F_COUNTER, "Jobs that became dead (attempts spent)"},
	{"pgjq_jobs_rescued_total", F_COUNTER, "Running jobs whose lease expired and that were rescued"},
	{"pgjq_jobs_cancelled_total", F_COUNTER, "Jobs that ended cancelled"},
	{"pgjq_jobs_snoozed_total", F_COUNTER, "Running jobs snoozed"},
	{"pgjq_stale_outcomes_total", F_COUNTER, "Outcome calls whose token no longer matched a running job (queue unknown: no queue label)"},
	{"pgjq_claims_held_back_total", F_COUNTER, "Claims that a limit (concurrency, key_concurrency, rate, paused, key_rate) cut short or stopped"},
	{"pgjq_job_run_unknown_total", F_COUNTER, "Outcomes whose claim time was no longer known (see pgjq.max_metrics_claims)"},
	{"pgjq_claim_wait_seconds", F_HISTOGRAM, "How long claims with wait that found nothing at first waited"},
	{"pgjq_job_run_seconds", F_HISTOGRAM, "Job run time from claim to outcome"},
	{"pgjq_worker_last_pass_timestamp_seconds", F_GAUGE, "When the database's pgjq worker last finished a pass (Unix time)"},
	{"pgjq_worker_last_pass_duration_seconds", F_GAUGE, "How long the database's pgjq worker's last pass took"},
	{"pgjq_horizon_age_seconds", F_GAUGE, "Age of the oldest transaction holding back the xmin horizon (absent for a replication slot)"},
	{"pgjq_horizon_age_xacts", F_GAUGE, "Transactions between the xmin horizon and the next transaction ID"},
};

#define NHELD (PGJQ_M_HELD_KEY_RATE - PGJQ_M_HELD_CONCURRENCY + 1)
static const char *const held_limit[NHELD] = {"concurrency", "key_concurrency", "rate", "paused",
"key_rate"};

/*
 * Samples are not kept: each is handed to the caller's emit function as
 * soon as the next one starts (labels are added after add_sample), so a
 * large database costs no array of samples.
 */
typedef struct Collector Collector;
struct Collector
{
	void		(*emit) (Collector *c, const Sample *s);
	void	   *arg;
	Sample		cur;
	bool		has_cur;
};

static void
flush_sample(Collector *c)
{
	if (c->has_cur)
		c->emit(c, &c->cur);
	c->has_cur = false;
}

static Sample *
add_sample(Collector *c, int family, const char *suffix, double value)
{
	Sample	   *s = &c->cur;

	flush_sample(c);
	memset(s, 0, sizeof(Sample));
	s->family = family;
	s->suffix = suffix;
	s->value = value;
	c->has_cur = true;
	return s;
}

static void
label(Sample *s, const char *name, const char *value)
{
	if (value == NULL)
		return;					/* the queue-0 entry: no queue label */
	s->lname[s->nlabels] = name;
	s->lvalue[s->nlabels] = value;
	s->nlabels++;
}

static int
counter_family(PgjqMetric m)
{
	if (m >= PGJQ_M_HELD_CONCURRENCY && m <= PGJQ_M_HELD_KEY_RATE)
		return FAM_COUNTERS + PGJQ_M_HELD_CONCURRENCY;
	if (m == PGJQ_M_RUN_UNKNOWN)
		return FAM_COUNTERS + PGJQ_M_HELD_CONCURRENCY + 1;
	return FAM_COUNTERS + m;
}

static void
add_histogram(Collector *c, int family, const char *queue, const MetricsHist *h)
{
	uint64		cum = 0;
	Sample	   *s;

	for (int b = 0; b <= NBUCKETS; b++)
	{
		cum += h->buckets[b];
		s = add_sample(c, family, "_bucket", (double) cum);
		label(s, "queue", queue);
		label(s, "le", b < NBUCKETS ? bucket_label[b] : "+Inf");
	}
	s = add_sample(c, family, "_sum", h->sum);
	label(s, "queue", queue);
	s = add_sample(c, family, "_count", (double) h->count);
	label(s, "queue", queue);
}

/* Order of copied entries by queue (one database and incarnation). */
static int
queue_metrics_cmp(const void *a, const void *b)
{
	int32		qa = ((const QueueMetrics *) a)->key.queue_id;
	int32		qb = ((const QueueMetrics *) b)->key.queue_id;

	return (qa > qb) - (qa < qb);
}

/* The plan behind the horizon series: health()'s ages. */
static PgjqPlan plan_horizon = {
	"SELECT horizon_age_seconds, horizon_age_xacts::float8 FROM pgjq.health()",
	0, {0}
};

static double
seconds_since_epoch(TimestampTz t)
{
	return (double) (t - SetEpochTimestamp()) / USECS_PER_SEC;
}

/*
 * Gather every sample, grouped by family in the order of families[]: the
 * gauges from the tables, then the counters of the database's queues (of
 * one queue when `name` is not NULL).
 */
static void
collect(const char *name, Collector *c)
{
	PgjqQueue	queue;
	int32		only = 0;
	PgjqQueueGauges *g;
	int			ng;
	QueueMetrics *qm = NULL;
	int			nqm = 0;
	uint64		overflow = 0;
	const char **qm_name;
	PgjqWorkerPass *passes = NULL;
	int			npasses;
	bool		have_horizon = false;
	bool		horizon_null = true;
	double		horizon_s = 0;
	double		horizon_x = 0;
	TimestampTz now = GetCurrentTimestamp();

	pgjq_storage_begin();
	if (name)
	{
		pgjq_storage_queue_get_or_error(name, &queue);
		only = queue.queue_id;
	}
	ng = pgjq_storage_queue_gauges(only, now, &g);
	if (name == NULL)
	{
		bool		isnull;

		pgjq_spi_run(&plan_horizon, NULL, NULL, 1);
		if (SPI_processed == 1)
		{
			have_horizon = true;
			horizon_s = DatumGetFloat8(pgjq_spi_get(0, 1, &horizon_null));
			horizon_x = DatumGetFloat8(pgjq_spi_get(0, 2, &isnull));
		}
	}
	pgjq_storage_end();

	/* the counters: copy this database's entries out under the lock */
	if (shared)
	{
		HASH_SEQ_STATUS scan;
		QueueMetrics *e;
		long		cap = 64;

		/* room for every entry: sized under the lock, grown outside it */
		qm = palloc(sizeof(QueueMetrics) * cap);
		for (;;)
		{
			LWLockAcquire(shared->lock, LW_EXCLUSIVE);
			if (hash_get_num_entries(queues) <= cap)
				break;
			cap = hash_get_num_entries(queues) + 64;
			LWLockRelease(shared->lock);
			qm = repalloc(qm, sizeof(QueueMetrics) * cap);
		}
		overflow = shared->overflow;
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
	}

	/*
	 * One entry per queue, by name, and the queue-0 entry last.  A queue
	 * without an entry has counted nothing since the server started, unless
	 * counts overflowed: then its counters are left out rather than shown as
	 * zeros.  Entries of dropped queues are skipped.
	 */
	{
		QueueMetrics *rows = palloc0(sizeof(QueueMetrics) * (ng + 1));
		int			nrows = 0;

		qm_name = palloc0(sizeof(char *) * (ng + 1));
		if (nqm > 1)
			qsort(qm, nqm, sizeof(QueueMetrics), queue_metrics_cmp);
		for (int k = 0; k < ng && shared; k++)
		{
			QueueMetrics key;
			QueueMetrics *e;

			key.key.queue_id = g[k].queue_id;
			e = nqm > 0 ? bsearch(&key, qm, nqm, sizeof(QueueMetrics), queue_metrics_cmp) : NULL;
			if (e == NULL && overflow > 0)
				continue;
			if (e != NULL)
				rows[nrows] = *e;
			rows[nrows].key.queue_id = g[k].queue_id;
			qm_name[nrows++] = g[k].name;
		}
		for (int i = 0; i < nqm; i++)
			if (qm[i].key.queue_id == 0)
				rows[nrows++] = qm[i];
		qm = rows;
		nqm = nrows;
	}
	npasses = name ? 0 : pgjq_shmem_worker_passes(&passes);

	add_sample(c, FAM_AVAILABLE, "", shared ? 1 : 0);
	if (shared && name == NULL)
		add_sample(c, FAM_OVERFLOW, "", (double) overflow);
	for (int k = 0; k < ng; k++)
	{
		static const char *const states[5] = {"ready", "scheduled", "running", "dead", "waiting"};
		int64		v[5] = {g[k].ready, g[k].scheduled, g[k].running, g[k].dead, g[k].waiting};

		for (int s = 0; s < 5; s++)
		{
			Sample	   *smp = add_sample(c, FAM_JOBS, "", (double) v[s]);

			label(smp, "queue", g[k].name);
			label(smp, "state", states[s]);
		}
	}
	for (int k = 0; k < ng; k++)
		if (g[k].has_oldest_ready)
			label(add_sample(c, FAM_OLDEST_READY, "", g[k].oldest_ready_age), "queue", g[k].name);
	for (int k = 0; k < ng; k++)
		if (g[k].has_next_scheduled)
			label(add_sample(c, FAM_NEXT_SCHEDULED, "", g[k].next_scheduled_in), "queue", g[k].name);
	for (int k = 0; k < ng; k++)
		label(add_sample(c, FAM_HELD_KEYS, "", (double) g[k].held_keys), "queue", g[k].name);

	/* counters: one family at a time, each queue's entry in it */
	for (int m = 0; m < PGJQ_M_NCOUNTERS && shared; m++)
	{
		if (m > PGJQ_M_HELD_CONCURRENCY && m <= PGJQ_M_HELD_KEY_RATE)
			continue;			/* with PGJQ_M_HELD_CONCURRENCY */
		for (int i = 0; i < nqm; i++)
		{
			if (qm[i].key.queue_id != 0 && qm_name[i] == NULL)
				continue;
			if (m == PGJQ_M_HELD_CONCURRENCY)
			{
				/* a claim always knows its queue */
				if (qm[i].key.queue_id == 0)
					continue;
				for (int l = 0; l < NHELD; l++)
				{
					Sample	   *s = add_sample(c, counter_family(m), "",
											   (double) qm[i].counters[m + l]);

					label(s, "queue", qm_name[i]);
					label(s, "limit", held_limit[l]);
				}
				continue;
			}
			/* the queue-0 entry holds only what had no queue */
			if (qm[i].key.queue_id == 0 && qm[i].counters[m] == 0)
				continue;
			label(add_sample(c, counter_family(m), "", (double) qm[i].counters[m]),
				  "queue", qm_name[i]);
		}
	}
	for (int i = 0; i < nqm && shared; i++)
		if (qm_name[i] != NULL)
			add_histogram(c, FAM_WAIT, qm_name[i], &qm[i].wait);
	for (int i = 0; i < nqm && shared; i++)
		if (qm_name[i] != NULL)
			add_histogram(c, FAM_RUN, qm_name[i], &qm[i].run);

	for (int p = 0; p < npasses; p++)
		label(add_sample(c, FAM_WORKER_PASS_AT, "", seconds_since_epoch(passes[p].end)),
			  "database", passes[p].dbname);
	for (int p = 0; p < npasses; p++)
		label(add_sample(c, FAM_WORKER_PASS_DURATION, "",
						 (double) passes[p].duration_us / USECS_PER_SEC),
			  "database", passes[p].dbname);
	if (have_horizon && !horizon_null)
		add_sample(c, FAM_HORIZON_SECONDS, "", horizon_s);
	if (have_horizon)
		add_sample(c, FAM_HORIZON_XACTS, "", horizon_x);
	flush_sample(c);
}

/* The queue argument: NULL (every queue) or a valid name. */
static char *
queue_filter(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		return NULL;
	return pgjq_arg_queue_name(fcinfo, 0);
}

/* A number as Prometheus and jsonb both read it. */
static void
append_value(StringInfo buf, double v)
{
	if (isnan(v))
		appendStringInfoString(buf, "NaN");
	else if (isinf(v))
		appendStringInfoString(buf, v > 0 ? "+Inf" : "-Inf");
	else if (v == floor(v) && fabs(v) < 1e15)
		appendStringInfo(buf, "%.0f", v);
	else
		appendStringInfo(buf, "%.9g", v);
}

static int
suffix_index(const char *suffix)
{
	if (strcmp(suffix, "_bucket") == 0)
		return 1;
	if (strcmp(suffix, "_sum") == 0)
		return 2;
	if (strcmp(suffix, "_count") == 0)
		return 3;
	return 0;
}

static void
push_string(JsonbParseState **state, JsonbIteratorToken token, const char *str)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) str;
	v.val.string.len = strlen(str);
	(void) pushJsonbValue(state, token, &v);
}

/* The sample's labels as a jsonb object, built without parsing text. */
static Datum
labels_jsonb(const Sample *s)
{
	JsonbParseState *state = NULL;
	JsonbValue *res;

	(void) pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (int l = 0; l < s->nlabels; l++)
	{
		push_string(&state, WJB_KEY, s->lname[l]);
		push_string(&state, WJB_VALUE, s->lvalue[l]);
	}
	res = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbPGetDatum(JsonbValueToJsonb(res));
}

PG_FUNCTION_INFO_V1(pgjq_metrics);
PG_FUNCTION_INFO_V1(pgjq_metrics_prometheus);

typedef struct RowsState
{
	ReturnSetInfo *rsinfo;
	Datum		names[NFAMILIES][4];	/* one text per family and suffix */
	MemoryContext rowcxt;		/* each row's jsonb, freed once stored */
} RowsState;

static void
emit_row(Collector *c, const Sample *s)
{
	RowsState  *st = c->arg;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	int			sfx = suffix_index(s->suffix);
	MemoryContext old;

	if (st->names[s->family][sfx] == (Datum) 0)
		st->names[s->family][sfx] =
			CStringGetTextDatum(psprintf("%s%s", families[s->family].name, s->suffix));
	values[0] = st->names[s->family][sfx];
	old = MemoryContextSwitchTo(st->rowcxt);
	values[1] = labels_jsonb(s);
	MemoryContextSwitchTo(old);
	values[2] = Float8GetDatum(s->value);
	tuplestore_putvalues(st->rsinfo->setResult, st->rsinfo->setDesc, values, nulls);
	MemoryContextReset(st->rowcxt);
}

/*
 * pgjq.metrics(queue): one row per sample (name, labels, value).  Without a
 * queue, every queue of the database and the database-wide series.
 */
Datum
pgjq_metrics(PG_FUNCTION_ARGS)
{
	char	   *name = queue_filter(fcinfo);
	RowsState	st;
	Collector	c;

	pgjq_srf_materialize(fcinfo);
	memset(&st, 0, sizeof(st));
	st.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	st.rowcxt = AllocSetContextCreate(CurrentMemoryContext, "pgjq metrics row",
									  ALLOCSET_DEFAULT_SIZES);
	memset(&c, 0, sizeof(c));
	c.emit = emit_row;
	c.arg = &st;
	collect(name, &c);
	MemoryContextDelete(st.rowcxt);
	return (Datum) 0;
}

/* A label value with \, " and newline escaped, as the text format wants. */
static void
append_label_value(StringInfo buf, const char *v)
{
	for (const char *p = v; *p; p++)
	{
		if (*p == '\\')
			appendStringInfoString(buf, "\\\\");
		else if (*p == '"')
			appendStringInfoString(buf, "\\\"");
		else if (*p == '\n')
			appendStringInfoString(buf, "\\n");
		else
			appendStringInfoChar(buf, *p);
	}
}

typedef struct TextState
{
	StringInfoData buf;
	int			last;			/* the family whose header was written */
} TextState;

static void
emit_line(Collector *c, const Sample *s)
{
	TextState  *st = c->arg;
	StringInfo	buf = &st->buf;
	const Family *f = &families[s->family];

	if (s->family != st->last)
	{
		appendStringInfo(buf, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
						 f->type == F_GAUGE ? "gauge" :
						 f->type == F_COUNTER ? "counter" : "histogram");
		st->last = s->family;
	}
	appendStringInfoString(buf, f->name);
	appendStringInfoString(buf, s->suffix);
	if (s->nlabels > 0)
	{
		appendStringInfoChar(buf, '{');
		for (int l = 0; l < s->nlabels; l++)
		{
			if (l > 0)
				appendStringInfoChar(buf, ',');
			appendStringInfoString(buf, s->lname[l]);
			appendStringInfoString(buf, "=\"");
			append_label_value(buf, s->lvalue[l]);
			appendStringInfoChar(buf, '"');
		}
		appendStringInfoChar(buf, '}');
	}
	appendStringInfoChar(buf, ' ');
	append_value(buf, s->value);
	appendStringInfoChar(buf, '\n');
}

/*
 * pgjq.metrics_prometheus(queue): the same samples in the Prometheus text
 * exposition format (version 0.0.4), # HELP and # TYPE once per family.
 */
Datum
pgjq_metrics_prometheus(PG_FUNCTION_ARGS)
{
	char	   *name = queue_filter(fcinfo);
	TextState	st;
	Collector	c;

	initStringInfo(&st.buf);
	st.last = -1;
	memset(&c, 0, sizeof(c));
	c.emit = emit_line;
	c.arg = &st;
	collect(name, &c);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(st.buf.data, st.buf.len));
}
