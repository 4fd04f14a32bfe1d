/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  The SQL functions metrics() and metrics_prometheus(): the per-queue
 *	  counters and histograms of state/metric_counters.c, shown with the
 *	  gauges read from the tables (storage_metrics.c), the worker's passes
 *	  (worker_slots.c) and the vacuum horizon (horizon.c's health()).
 *
 * Order of operations: collect() reads the gauges and the horizon in one
 * call of the storage engine (whose begin hook also tells the counters the
 * extension's incarnation), then copies this database's counter entries out
 * of shared memory, matches them to the queues by id and hands each sample,
 * family by family in the order of families[], to an emit function: one
 * row of metrics() (name, labels as jsonb, value) or one line of the
 * Prometheus text format.  Samples are not kept.
 *
 * Locking: none here; metric_counters.c holds its lock only while it copies
 * the entries out, and no SPI call or formatting happens under it.
 *
 *-------------------------------------------------------------------------
 */
#include "api/guard.h"
#include "common/args.h"
#include "common/spi_plans.h"
#include "engine/engine.h"
#include "state/metric_counters.h"
#include "state/worker_slots.h"

#include <math.h>

#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define NBUCKETS PGJQ_METRICS_NBUCKETS

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
add_histogram(Collector *c, int family, const char *queue, const PgjqMetricsHist *h)
{
	uint64		cum = 0;
	Sample	   *s;

	for (int b = 0; b <= NBUCKETS; b++)
	{
		cum += h->buckets[b];
		s = add_sample(c, family, "_bucket", (double) cum);
		label(s, "queue", queue);
		label(s, "le", b < NBUCKETS ? pgjq_metrics_bucket_label[b] : "+Inf");
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
	int32		qa = ((const PgjqQueueMetrics *) a)->key.queue_id;
	int32		qb = ((const PgjqQueueMetrics *) b)->key.queue_id;

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
	PgjqQueueMetrics *qm = NULL;
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
	bool		available = pgjq_metrics_available();

	pgjq_storage_begin();
	if (name)
	{
		pgjq_guard_queue(name, PGJQ_GUARD_USE);
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

	/* the counters: this database's entries, copied out under their lock */
	nqm = pgjq_metrics_copy_entries(only, &qm, &overflow);

	/*
	 * One entry per queue, by name, and the queue-0 entry last.  A queue
	 * without an entry has counted nothing since the server started, unless
	 * counts overflowed: then its counters are left out rather than shown as
	 * zeros.  Entries of dropped queues are skipped.
	 */
	{
		PgjqQueueMetrics *rows = palloc0(sizeof(PgjqQueueMetrics) * (ng + 1));
		int			nrows = 0;

		qm_name = palloc0(sizeof(char *) * (ng + 1));
		if (nqm > 1)
			qsort(qm, nqm, sizeof(PgjqQueueMetrics), queue_metrics_cmp);
		for (int k = 0; k < ng && available; k++)
		{
			PgjqQueueMetrics key;
			PgjqQueueMetrics *e;

			key.key.queue_id = g[k].queue_id;
			e = nqm > 0 ? bsearch(&key, qm, nqm, sizeof(PgjqQueueMetrics), queue_metrics_cmp) : NULL;
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

	add_sample(c, FAM_AVAILABLE, "", available ? 1 : 0);
	if (available && name == NULL)
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
	for (int m = 0; m < PGJQ_M_NCOUNTERS && available; m++)
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
	for (int i = 0; i < nqm && available; i++)
		if (qm_name[i] != NULL)
			add_histogram(c, FAM_WAIT, qm_name[i], &qm[i].wait);
	for (int i = 0; i < nqm && available; i++)
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
