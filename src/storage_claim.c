/*-------------------------------------------------------------------------
 *
 * storage_claim.c
 *	  Fair claim on the first storage engine.
 *
 * Order: smaller priority first; within a priority, round-robin across the
 * fair_key values that have ready jobs; within a key, oldest (lowest id)
 * first.  The ready jobs are indexed by (queue_id, priority, fair_key, id)
 * WHERE state = 'r', so each step is an index probe and a claim costs
 * O(batch + keys visited), not O(backlog):
 *
 *	 1. find the smallest priority >= the current one with a ready job;
 *	 2. list up to `remaining` keys at that priority, starting after the key
 *		served last (a loose index scan), wrapping around once;
 *	 3. lock up to ceil(remaining / keys) oldest jobs of each key (fewer if
 *		the key's concurrency limit says so) with FOR UPDATE SKIP LOCKED,
 *		pick them round by round (1st of every key, then 2nd, ...) and lease
 *		the picks in the same statement.
 *
 * A key at its limit is skipped without touching its jobs: they spend no
 * attempt and stay unlocked, and later keys fill the batch.
 *
 * A round that leases nothing at a priority (its jobs are locked by other
 * claimers) moves on to the next priority, so the loop ends.  Rows locked but
 * not picked stay locked until commit; there are fewer than `keys` of them.
 *
 * The "key served last" is remembered per backend and queue: each worker
 * cycles through the keys, so the cluster as a whole is fair.
 *
 *-------------------------------------------------------------------------
 */
#include "storage_internal.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

/*
 * One round's listing in one statement: the smallest priority >= $2 with
 * ready jobs, then up to $4 of its keys >= $3 (part 1: after the cursor) and
 * up to $4 keys from the start up to the cursor $5 (part 2: the wrap-around).
 * Both parts are loose index scans.  No row: no ready job at >= $2.
 */
#define NEXT_KEY(cte) \
	"  SELECT (SELECT j.fair_key FROM pgjq.job j" \
	"           WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = (SELECT priority FROM p)" \
	"             AND j.fair_key > " cte ".fair_key" \
	"           ORDER BY j.queue_id, j.priority, j.fair_key LIMIT 1)"
#define KEY_AFTER(cte, bound) \
	"  (SELECT j.fair_key FROM pgjq.job j" \
	"    WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = (SELECT priority FROM p)" \
	"      AND j.fair_key >= " bound \
	"    ORDER BY j.queue_id, j.priority, j.fair_key LIMIT 1)" \
	"  UNION ALL" \
	NEXT_KEY(cte)

/*
 * p: the smallest priority >= $2 with a ready job and its first key, found
 * by one index descent; b, the wrap-around part, starts from that key.
 */
#define FIRST_KEY \
	" p AS (SELECT priority, fair_key FROM pgjq.job" \
	"        WHERE queue_id = $1 AND state = 'r' AND priority >= $2" \
	"        ORDER BY queue_id, priority, fair_key LIMIT 1),"
#define WRAP_KEYS \
	" b(fair_key) AS ((SELECT fair_key FROM p) UNION ALL " NEXT_KEY("b") \
	"                 FROM b WHERE b.fair_key < $5)"

static PgjqPlan plan_scan = {
	"WITH RECURSIVE"
	FIRST_KEY
	" a(fair_key) AS (" KEY_AFTER("a", "$3") " FROM a WHERE a.fair_key IS NOT NULL),"
	WRAP_KEYS
	" SELECT (SELECT priority FROM p), 1, x.fair_key"
	"   FROM (SELECT fair_key FROM a WHERE fair_key IS NOT NULL LIMIT $4) x"
	" UNION ALL"
	" SELECT (SELECT priority FROM p), 2, y.fair_key"
	"   FROM (SELECT fair_key FROM b WHERE fair_key <= $5 LIMIT $4) y",
	5, {INT4OID, INT2OID, TEXTOID, INT4OID, TEXTOID}
};

/*
 * The whole round in one statement, for queues without a per-key limit: list
 * the keys as plan_scan does, lock ceil($4 / keys) oldest jobs of each, pick
 * them round by round and lease the picks.  Same parameters as plan_scan,
 * then $6 lease end, $7 worker, $8 the call's token if it has one already.
 * Otherwise the token is drawn by an InitPlan, which runs only when a row is
 * leased: an empty poll writes nothing.
 */
static PgjqPlan plan_round = {
	"WITH RECURSIVE"
	FIRST_KEY
	" a(fair_key) AS (" KEY_AFTER("a", "$3") " FROM a WHERE a.fair_key IS NOT NULL),"
	WRAP_KEYS ","
	" k AS (SELECT z.fair_key, row_number() OVER (ORDER BY z.part, z.fair_key) AS ord"
	"         FROM ((SELECT 1 AS part, fair_key FROM a WHERE fair_key IS NOT NULL LIMIT $4)"
	"               UNION ALL"
	"               (SELECT 2, fair_key FROM b WHERE fair_key <= $5 LIMIT $4)) z),"
	" n AS (SELECT count(*)::int4 AS n FROM k WHERE k.ord <= $4),"
	" c AS (SELECT l.id, k.ord, row_number() OVER (PARTITION BY k.ord ORDER BY l.id) AS rn"
	"         FROM k CROSS JOIN LATERAL"
	"              (SELECT j.id FROM pgjq.job j"
	"                WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = (SELECT priority FROM p)"
	"                  AND j.fair_key >= k.fair_key AND j.fair_key <= k.fair_key"
	"                ORDER BY j.fair_key, j.id"
	"                LIMIT ($4 + (SELECT n FROM n) - 1) / (SELECT n FROM n)"
	"                FOR UPDATE SKIP LOCKED) l"
	"        WHERE k.ord <= $4)"
	" UPDATE pgjq.job j SET state = 'a', attempt = j.attempt + 1,"
	"        token = COALESCE($8, (SELECT nextval('pgjq.token_seq'))),"
	"        lease_until = $6, worker = $7"
	"  WHERE j.id = ANY (ARRAY(SELECT c.id FROM c ORDER BY c.rn, c.ord LIMIT $4))"
	" RETURNING j.id, j.attempt, j.payload, j.fair_key, j.priority, j.enqueued_at, j.token",
	8, {INT4OID, INT2OID, TEXTOID, INT4OID, TEXTOID, TIMESTAMPTZOID, TEXTOID, INT8OID}
};

static PgjqPlan plan_next_priority = {
	"SELECT priority FROM pgjq.job"
	" WHERE queue_id = $1 AND state = 'r' AND priority >= $2"
	" ORDER BY queue_id, priority LIMIT 1",
	2, {INT4OID, INT2OID}
};

/*
 * The most urgent priority with a ready job of the queue in pgjq.job (one
 * descent of the ready index); false when it has none.  Rows another claim
 * holds count: they are ready until that claim commits.
 */
bool
pgjq_storage_first_ready_priority(int32 queue_id, int16 *priority)
{
	Datum		values[2] = {Int32GetDatum(queue_id), Int16GetDatum(PG_INT16_MIN)};
	bool		isnull;

	pgjq_spi_run(&plan_next_priority, values, NULL, 1);
	if (SPI_processed == 0)
		return false;
	*priority = DatumGetInt16(pgjq_spi_get(0, 1, &isnull));
	return true;
}

/* Keys >= $3 at priority $2, in order, at most $4: a loose index scan. */
static PgjqPlan plan_keys = {
	"WITH RECURSIVE k(fair_key) AS ("
	"  (SELECT j.fair_key FROM pgjq.job j"
	"    WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = $2 AND j.fair_key >= $3"
	"    ORDER BY j.queue_id, j.priority, j.fair_key LIMIT 1)"
	"  UNION ALL"
	"  SELECT (SELECT j.fair_key FROM pgjq.job j"
	"           WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = $2"
	"             AND j.fair_key > k.fair_key"
	"           ORDER BY j.queue_id, j.priority, j.fair_key LIMIT 1)"
	"    FROM k WHERE k.fair_key IS NOT NULL)"
	" SELECT fair_key FROM k WHERE fair_key IS NOT NULL LIMIT $4",
	4, {INT4OID, INT2OID, TEXTOID, INT4OID}
};

/*
 * Lock and lease.  The key condition is written as a range (>= and <=) on
 * purpose: with an equality the planner reduces ORDER BY (fair_key, id) to
 * ORDER BY id and may walk the primary key instead of the ready index.  The
 * UPDATE takes the picks as an id array so that it probes the primary key
 * whatever the (unknowable) batch size; round and key order are rebuilt in C.
 */
static PgjqPlan plan_lease = {
	"WITH c AS ("
	"  SELECT l.id, k.ord, row_number() OVER (PARTITION BY k.ord ORDER BY l.id) AS rn"
	"    FROM unnest($3::text[], $4::int4[]) WITH ORDINALITY AS k(fair_key, quota, ord)"
	"   CROSS JOIN LATERAL"
	"        (SELECT j.id FROM pgjq.job j"
	"          WHERE j.queue_id = $1 AND j.state = 'r' AND j.priority = $2"
	"            AND j.fair_key >= k.fair_key AND j.fair_key <= k.fair_key"
	"          ORDER BY j.fair_key, j.id"
	"          LIMIT k.quota FOR UPDATE SKIP LOCKED) l)"
	" UPDATE pgjq.job j SET state = 'a', attempt = j.attempt + 1, token = $6,"
	"        lease_until = $7, worker = $8"
	"  WHERE j.id = ANY (ARRAY(SELECT c.id FROM c ORDER BY c.rn, c.ord LIMIT $5))"
	" RETURNING j.id, j.attempt, j.payload, j.fair_key, j.priority, j.enqueued_at",
	8, {INT4OID, INT2OID, TEXTARRAYOID, INT4ARRAYOID, INT4OID, INT8OID, TIMESTAMPTZOID, TEXTOID}
};

/* The key served last, per queue, in this backend. */
#define CURSOR_SLOTS 32
typedef struct FairCursor
{
	int32		queue_id;
	char	   *key;			/* TopMemoryContext; NULL = none yet */
} FairCursor;
static FairCursor cursors[CURSOR_SLOTS];
static int	cursor_next_victim = 0;

static FairCursor *
cursor_for(int32 queue_id)
{
	FairCursor *c;

	for (int i = 0; i < CURSOR_SLOTS; i++)
		if (cursors[i].queue_id == queue_id && cursors[i].key != NULL)
			return &cursors[i];
	c = &cursors[cursor_next_victim];
	cursor_next_victim = (cursor_next_victim + 1) % CURSOR_SLOTS;
	if (c->key)
		pfree(c->key);
	c->queue_id = queue_id;
	c->key = MemoryContextStrdup(TopMemoryContext, "");
	return c;
}

static void
cursor_set(FairCursor *c, const char *key)
{
	char	   *copy = MemoryContextStrdup(TopMemoryContext, key);

	pfree(c->key);
	c->key = copy;
}

/*
 * Append to keys[] up to `limit` keys at priority `prio` that are >= from,
 * and (when upto is not NULL) <= upto, asking the quota how many jobs of each
 * may be taken (keys at their limit are skipped, and the listing goes on past
 * them).  *last is set to the last key seen.
 */
static int
list_keys(int32 queue_id, int16 prio, const char *from, const char *upto,
		  int limit, int per_key, PgjqClaimQuota *quota,
		  Datum *keys, char **keystr, int32 *quotas, int nkeys, char **last)
{
	char	   *start = pstrdup(from);

	for (;;)
	{
		Datum		values[4];
		int			seen;

		values[0] = Int32GetDatum(queue_id);
		values[1] = Int16GetDatum(prio);
		values[2] = CStringGetTextDatum(start);
		values[3] = Int32GetDatum(limit);
		pgjq_spi_run(&plan_keys, values, NULL, 0);
		seen = (int) SPI_processed;
		for (int r = 0; r < seen && limit > 0; r++)
		{
			bool		isnull;
			char	   *k = TextDatumGetCString(pgjq_spi_get(r, 1, &isnull));
			int			granted;

			if (upto && strcmp(k, upto) > 0)
				return nkeys;
			*last = k;
			granted = quota->reserve(quota, k, per_key);
			if (granted <= 0)
				continue;
			keystr[nkeys] = k;
			quotas[nkeys] = granted;
			keys[nkeys++] = CStringGetTextDatum(k);
			limit--;
		}
		/* fewer rows than asked: no more keys; else go on after the last one */
		if (limit == 0 || seen < DatumGetInt32(values[3]))
			return nkeys;
		start = psprintf("%s\x01", *last);
	}
}

typedef struct Pick
{
	PgjqClaimedJob job;
	int64		rn;
	int64		ord;
} Pick;

/* Order of picks by key position, then id (to number them within a key). */
static int
pick_by_key(const void *a, const void *b)
{
	const Pick *pa = a,
			   *pb = b;

	if (pa->ord != pb->ord)
		return pa->ord < pb->ord ? -1 : 1;
	if (pa->job.id != pb->job.id)
		return pa->job.id < pb->job.id ? -1 : 1;
	return 0;
}

/* Keys of a round sorted (C collation, as the index), for key_position(). */
typedef struct KeyPos
{
	const char *key;
	int			pos;			/* 1-based place in the round */
} KeyPos;

static int
keypos_cmp(const void *a, const void *b)
{
	return strcmp(((const KeyPos *) a)->key, ((const KeyPos *) b)->key);
}

static KeyPos *
sort_keys(char **keys, int n)
{
	KeyPos	   *kp = palloc(sizeof(KeyPos) * n);

	for (int k = 0; k < n; k++)
	{
		kp[k].key = keys[k];
		kp[k].pos = k + 1;
	}
	qsort(kp, n, sizeof(KeyPos), keypos_cmp);
	return kp;
}

/* 1-based position of key in the round (keys of a round are distinct). */
static int
key_position(const KeyPos *sorted, int n, const char *key)
{
	KeyPos		probe = {key, 0};
	const KeyPos *hit = bsearch(&probe, sorted, n, sizeof(KeyPos), keypos_cmp);

	if (hit == NULL)
		elog(ERROR, "pgjq: claim picked a job of an unlisted key");
	return hit->pos;
}

static int
pick_cmp(const void *a, const void *b)
{
	const Pick *pa = a,
			   *pb = b;

	if (pa->rn != pb->rn)
		return pa->rn < pb->rn ? -1 : 1;
	if (pa->ord != pb->ord)
		return pa->ord < pb->ord ? -1 : 1;
	return 0;
}

/* Round order of plan_round's picks: keys after the cursor first. */
static const char *round_cursor;

static const char *
pick_key(const Pick *pk)
{
	return pk->job.fair_key ? TextDatumGetCString(pk->job.fair_key) : "";
}

static int
round_cmp(const void *a, const void *b)
{
	const Pick *pa = a,
			   *pb = b;
	const char *ka = pick_key(pa);
	const char *kb = pick_key(pb);
	int			ca = strcmp(ka, round_cursor) > 0 ? 0 : 1;
	int			cb = strcmp(kb, round_cursor) > 0 ? 0 : 1;
	int			c;

	if (ca != cb)
		return ca < cb ? -1 : 1;
	c = strcmp(ka, kb);
	if (c != 0)
		return c;
	return pa->job.id < pb->job.id ? -1 : (pa->job.id > pb->job.id ? 1 : 0);
}

/*
 * One round with plan_round.  Returns how many jobs it leased into jobs[],
 * in claim order, and settles each key with the quota; *p is their priority.
 */
static int
claim_round(const PgjqQueue *queue, int prio, int remaining, FairCursor *cursor,
			TimestampTz lease_until, const char *worker, int64 *token,
			PgjqClaimQuota *quota, PgjqClaimedJob *jobs, int *p)
{
	Datum		values[8];
	char		nulls[9] = "        ";
	Pick	   *picks;
	int			npicks;
	bool		isnull;
	int			ord = 0;

	values[0] = Int32GetDatum(queue->queue_id);
	values[1] = Int16GetDatum((int16) prio);
	values[2] = CStringGetTextDatum(psprintf("%s\x01", cursor->key));
	values[3] = Int32GetDatum(remaining);
	values[4] = CStringGetTextDatum(cursor->key);
	values[5] = TimestampTzGetDatum(lease_until);
	if (worker)
		values[6] = CStringGetTextDatum(worker);
	else
		nulls[6] = 'n';
	values[7] = Int64GetDatum(*token);
	if (*token == 0)
		nulls[7] = 'n';
	pgjq_spi_run(&plan_round, values, nulls, 0);
	npicks = (int) SPI_processed;
	if (npicks == 0)
		return 0;

	picks = palloc(sizeof(Pick) * npicks);
	for (int r = 0; r < npicks; r++)
	{
		Pick	   *pk = &picks[r];
		Datum		fk;
		MemoryContext old;

		pk->job.id = pgjq_spi_get_int64(r, 1);
		pk->job.attempt = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));
		pk->job.priority = DatumGetInt16(pgjq_spi_get(r, 5, &isnull));
		pk->job.enqueued_at = DatumGetTimestampTz(pgjq_spi_get(r, 6, &isnull));
		pk->job.token = pgjq_spi_get_int64(r, 7);
		fk = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 4, &isnull);
		old = MemoryContextSwitchTo(pgjq_result_cxt);
		pk->job.payload = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 3, &isnull);
		pk->job.payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(pk->job.payload));
		pk->job.fair_key = VARSIZE_ANY_EXHDR(DatumGetPointer(fk)) == 0 ? (Datum) 0 :
			PointerGetDatum(PG_DETOAST_DATUM_COPY(fk));
		MemoryContextSwitchTo(old);
	}
	*p = picks[0].job.priority;
	*token = picks[0].job.token;

	/* group the picks by key in round order; number them within the key */
	round_cursor = cursor->key;
	qsort(picks, npicks, sizeof(Pick), round_cmp);
	for (int start = 0, end; start < npicks; start = end)
	{
		const char *key = pick_key(&picks[start]);

		ord++;
		for (end = start; end < npicks && strcmp(pick_key(&picks[end]), key) == 0; end++)
		{
			picks[end].ord = ord;
			picks[end].rn = end - start + 1;
		}
		quota->settle(quota, key, 0, end - start);
	}
	qsort(picks, npicks, sizeof(Pick), pick_cmp);
	for (int r = 0; r < npicks; r++)
		jobs[r] = picks[r].job;
	cursor_set(cursor, pick_key(&picks[npicks - 1]));
	return npicks;
}

/*
 * Lease up to `batch` ready jobs of the queue in fair order, appending them
 * to jobs[] (room for batch, in the result context).  Returns how many.
 * *token is drawn from the sequence the first time a ready job is seen (an
 * empty poll costs no sequence call) and reused when already set.  The quota
 * bounds what each fair key may give.
 */
int
pgjq_storage_claim(const PgjqQueue *queue, int batch, TimestampTz lease_until,
				   const char *worker, PgjqClaimQuota *quota, int64 *token,
				   PgjqClaimedJob *jobs)
{
	FairCursor *cursor = cursor_for(queue->queue_id);
	Datum	   *keys = palloc(sizeof(Datum) * batch);
	char	  **keystr = palloc(sizeof(char *) * batch);
	int32	   *quotas = palloc(sizeof(int32) * batch);
	int			nout = 0;
	int			prio = PG_INT16_MIN;

	while (nout < batch && prio <= PG_INT16_MAX)
	{
		int			remaining = batch - nout;
		int			nkeys;
		int			per_key;
		int16		p;
		Datum		values[9];
		char		nulls[10] = "         ";
		bool		isnull;
		Pick	   *picks;
		int			npicks;
		int		   *picked;
		char	   *last = NULL;
		KeyPos	   *sorted_keys;

		CHECK_FOR_INTERRUPTS();

		if (!quota->per_key_limit)
		{
			int			got;

			got = claim_round(queue, prio, remaining, cursor, lease_until, worker, token,
							  quota, jobs + nout, &prio);
			if (got > 0)
			{
				nout += got;
				continue;		/* same priority: it may have more */
			}
			/* nothing leased: done, or every ready job there is locked */
			values[0] = Int32GetDatum(queue->queue_id);
			values[1] = Int16GetDatum((int16) prio);
			pgjq_spi_run(&plan_next_priority, values, NULL, 1);
			if (SPI_processed == 0)
				break;
			prio = DatumGetInt16(pgjq_spi_get(0, 1, &isnull)) + 1;
			continue;
		}

		/*
		 * 1 and 2: the smallest priority with ready jobs and its keys, after
		 * the cursor first, then from the start up to it.  Each key may give
		 * ceil(remaining / keys), known only once the keys are listed: ask
		 * the quota for `remaining` per key, then trim.  The smallest text
		 * greater than s is s || E'\x01' (text has no NUL).
		 */
		per_key = remaining;
		values[0] = Int32GetDatum(queue->queue_id);
		values[1] = Int16GetDatum((int16) prio);
		values[2] = CStringGetTextDatum(psprintf("%s\x01", cursor->key));
		values[3] = Int32GetDatum(remaining);
		values[4] = CStringGetTextDatum(cursor->key);
		pgjq_spi_run(&plan_scan, values, NULL, 0);
		if (SPI_processed == 0)
			break;
		p = DatumGetInt16(pgjq_spi_get(0, 1, &isnull));
		{
			int			nrows = (int) SPI_processed;
			char	  **rowkeys = palloc(sizeof(char *) * nrows);
			int		   *parts = palloc(sizeof(int) * nrows);
			int			inpart[3] = {0, 0, 0};
			char	   *lastin[3] = {NULL, NULL, NULL};

			for (int r = 0; r < nrows; r++)
			{
				parts[r] = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));
				rowkeys[r] = TextDatumGetCString(pgjq_spi_get(r, 3, &isnull));
				inpart[parts[r]]++;
				lastin[parts[r]] = rowkeys[r];
			}
			nkeys = 0;
			for (int part = 1; part <= 2; part++)
			{
				for (int r = 0; r < nrows && nkeys < remaining; r++)
				{
					int			granted;

					if (parts[r] != part)
						continue;
					granted = quota->reserve(quota, rowkeys[r], per_key);
					if (granted <= 0)
						continue;
					keystr[nkeys] = rowkeys[r];
					quotas[nkeys] = granted;
					keys[nkeys++] = CStringGetTextDatum(rowkeys[r]);
				}
				/* keys at their limit were skipped: list on past them */
				if (nkeys < remaining && inpart[part] == remaining)
					nkeys = list_keys(queue->queue_id, p, psprintf("%s\x01", lastin[part]),
									  part == 2 ? cursor->key : NULL, remaining - nkeys, per_key,
									  quota, keys, keystr, quotas, nkeys, &last);
			}
		}
		if (nkeys == 0)
		{
			prio = p + 1;
			continue;
		}
		per_key = (remaining + nkeys - 1) / nkeys;
		for (int k = 0; k < nkeys; k++)
		{
			if (quotas[k] > per_key)
			{
				quota->release(quota, keystr[k], quotas[k] - per_key);
				quotas[k] = per_key;
			}
		}

		/* 3. lock and lease, round by round across the keys */
		if (*token == 0)
			*token = pgjq_storage_next_token();
		values[0] = Int32GetDatum(queue->queue_id);
		values[1] = Int16GetDatum(p);
		values[2] = PointerGetDatum(construct_array(keys, nkeys, TEXTOID, -1, false, TYPALIGN_INT));
		{
			Datum	   *qd = palloc(sizeof(Datum) * nkeys);

			for (int k = 0; k < nkeys; k++)
				qd[k] = Int32GetDatum(quotas[k]);
			values[3] = PointerGetDatum(construct_array(qd, nkeys, INT4OID, 4, true, TYPALIGN_INT));
		}
		values[4] = Int32GetDatum(remaining);
		values[5] = Int64GetDatum(*token);
		values[6] = TimestampTzGetDatum(lease_until);
		if (worker)
			values[7] = CStringGetTextDatum(worker);
		else
			nulls[7] = 'n';
		pgjq_spi_run(&plan_lease, values, nulls, 0);

		npicks = (int) SPI_processed;
		sorted_keys = sort_keys(keystr, nkeys);
		picked = palloc0(sizeof(int) * nkeys);
		picks = palloc(sizeof(Pick) * Max(npicks, 1));
		for (int r = 0; r < npicks; r++)
		{
			Pick	   *pk = &picks[r];
			Datum		fk;
			MemoryContext old;
			char	   *fks;

			pk->job.id = pgjq_spi_get_int64(r, 1);
			pk->job.attempt = DatumGetInt32(pgjq_spi_get(r, 2, &isnull));
			pk->job.priority = DatumGetInt16(pgjq_spi_get(r, 5, &isnull));
			pk->job.enqueued_at = DatumGetTimestampTz(pgjq_spi_get(r, 6, &isnull));
			fk = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 4, &isnull);
			fks = TextDatumGetCString(fk);
			pk->ord = key_position(sorted_keys, nkeys, fks);
			picked[pk->ord - 1]++;
			old = MemoryContextSwitchTo(pgjq_result_cxt);
			pk->job.payload = SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 3, &isnull);
			pk->job.payload = PointerGetDatum(PG_DETOAST_DATUM_COPY(pk->job.payload));
			pk->job.fair_key = fks[0] == '\0' ? (Datum) 0 :
				PointerGetDatum(PG_DETOAST_DATUM_COPY(fk));
			MemoryContextSwitchTo(old);
		}
		/* rn: the job's place among its key's picks, oldest first */
		qsort(picks, npicks, sizeof(Pick), pick_by_key);
		for (int r = 0; r < npicks; r++)
			picks[r].rn = (r > 0 && picks[r - 1].ord == picks[r].ord) ? picks[r - 1].rn + 1 : 1;
		for (int k = 0; k < nkeys; k++)
			quota->settle(quota, keystr[k], quotas[k], picked[k]);
		if (npicks == 0)
		{
			prio = p + 1;
			continue;
		}
		qsort(picks, npicks, sizeof(Pick), pick_cmp);
		for (int r = 0; r < npicks; r++)
		{
			picks[r].job.token = *token;
			jobs[nout++] = picks[r].job;
		}
		cursor_set(cursor, keystr[picks[npicks - 1].ord - 1]);
		/* stay at this priority: it may still have ready jobs */
		prio = p;
	}
	return nout;
}
