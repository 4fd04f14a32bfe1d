/*
 * pgjq: update from 0.1.0 to 0.2.0 (ALTER EXTENSION pgjq UPDATE).
 *
 * 0.2.0 hardens 0.1.0 and replaces its storage of claimable and running
 * jobs with the ring engine (see CHANGELOG.md): 0.1.0's running jobs move
 * into the ring, its waiting ones stay in pgjq.job until claims or
 * promotion move them.  Every object whose definition changed is redefined here,
 * so that an updated installation is the same as a new one: the upgrade
 * test (test/t/070_upgrade_dump.pl) compares the two schemas object by object.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.2.0'" to load this file. \quit

/* 0.2.0 needs the preload: refused here, with a hint, before anything changes */
CREATE FUNCTION pgjq._require_preload() RETURNS void
	LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'pgjq_require_preload';
REVOKE ALL ON FUNCTION pgjq._require_preload() FROM PUBLIC;
/* as in a new installation, which grants pgjq_admin every function */
GRANT EXECUTE ON FUNCTION pgjq._require_preload() TO pgjq_admin;
SELECT pgjq._require_preload();

/*
 * The history tables lose their partitioned indexes (which made pg_restore
 * fail) and every existing partition gets the same indexes of its own, under
 * the names the C code gives new partitions.
 */
DROP INDEX pgjq.job_done_id_idx;
DROP INDEX pgjq.job_history_id_idx;
DROP INDEX pgjq.job_history_dead_idx;

DO $partitions$
DECLARE
	p record;
BEGIN
	FOR p IN
		SELECT c.relname AS name, parent.relname AS parent
		  FROM pg_catalog.pg_inherits i
		  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.inhrelid
		  JOIN pg_catalog.pg_class parent ON parent.oid OPERATOR(pg_catalog.=) i.inhparent
		 WHERE i.inhparent OPERATOR(pg_catalog.=) ANY (ARRAY['pgjq.job_done'::pg_catalog.regclass,
														 'pgjq.job_history'::pg_catalog.regclass])
	LOOP
		IF p.parent OPERATOR(pg_catalog.=) 'job_done' THEN
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I USING brin (min_id, max_id)',
									  p.name OPERATOR(pg_catalog.||) '_id_idx', p.name);
		ELSE
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I (id)',
									  p.name OPERATOR(pg_catalog.||) '_id_idx', p.name);
			EXECUTE pg_catalog.format('CREATE INDEX %I ON pgjq.%I (queue_id) WHERE state OPERATOR(pg_catalog.=) %L',
									  p.name OPERATOR(pg_catalog.||) '_dead_idx', p.name, 'd');
		END IF;
	END LOOP;
END
$partitions$;

/* New in 0.2.0: the vacuum horizon guard's report (pgjq_admin only). */
CREATE FUNCTION pgjq.health(
	OUT horizon_holder text,
	OUT horizon_xid xid,
	OUT horizon_age_xacts bigint,
	OUT horizon_age_seconds double precision,
	OUT horizon_held_since timestamptz,
	OUT pid integer,
	OUT backend_type text,
	OUT usename text,
	OUT application_name text,
	OUT state text,
	OUT xact_start timestamptz,
	OUT query_start timestamptz,
	OUT slot_name text,
	OUT gid text)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_health';
COMMENT ON FUNCTION pgjq.health() IS 'who holds back the xmin horizon (backend, prepared transaction or replication slot) and its age in transactions and in seconds (seconds NULL when the holder records no start: a slot, a walsender''s feedback; both 0 when nothing holds it)';
REVOKE ALL ON FUNCTION pgjq.health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.health() TO pgjq_admin;

/*
 * New in 0.2.0: results.  complete() takes a result (and the array form an
 * array of them), kept with the completed job in job_done and shown by
 * job(id).  The old signatures are replaced (a defaulted argument keeps
 * every existing call working).
 */
ALTER TABLE pgjq.job_done ADD COLUMN results jsonb[];
ALTER TYPE pgjq.job_info ADD ATTRIBUTE result jsonb;
DROP FUNCTION pgjq.complete(bigint, bigint);
DROP FUNCTION pgjq.complete(bigint[], bigint[]);
CREATE FUNCTION pgjq.complete(id bigint, token bigint, result jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_complete';
COMMENT ON FUNCTION pgjq.complete(bigint, bigint, jsonb) IS 'mark a running job completed, keeping its result (job(id) shows it while the job is in the history); false when the token is stale';

CREATE FUNCTION pgjq.complete(ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_complete_many';
COMMENT ON FUNCTION pgjq.complete(bigint[], bigint[], jsonb[]) IS 'complete many running jobs, results[i] the result of ids[i] (NULL: none); returns how many were completed (stale tokens are skipped)';
REVOKE ALL ON FUNCTION pgjq.complete(bigint, bigint, jsonb), pgjq.complete(bigint[], bigint[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.complete(bigint, bigint, jsonb), pgjq.complete(bigint[], bigint[], jsonb[])
	TO pgjq_worker, pgjq_admin;

/* New in 0.2.0: bulk cancel (pgjq_producer). */
CREATE FUNCTION pgjq.cancel_many(ids bigint[])
RETURNS bigint
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_cancel_many';
COMMENT ON FUNCTION pgjq.cancel_many(bigint[]) IS 'cancel(id) for each of ids; returns how many were cancelled or asked to stop';

CREATE FUNCTION pgjq.cancel_key(queue text, fair_key text)
RETURNS bigint
LANGUAGE C VOLATILE CALLED ON NULL INPUT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_cancel_key';
COMMENT ON FUNCTION pgjq.cancel_key(text, text) IS 'cancel(id) for every unfinished job of the queue with that fair_key (NULL: without one); returns how many were cancelled or asked to stop';
REVOKE ALL ON FUNCTION pgjq.cancel_many(bigint[]), pgjq.cancel_key(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.cancel_many(bigint[]), pgjq.cancel_key(text, text) TO pgjq_producer, pgjq_admin;

/* New in 0.2.0: a worker's cycle in one statement (pgjq_worker). */
CREATE FUNCTION pgjq.complete_and_claim(
	queue text,
	ids bigint[],
	tokens bigint[],
	batch integer DEFAULT 1,
	lease interval DEFAULT NULL,
	worker text DEFAULT NULL,
	errors text[] DEFAULT NULL,
	results jsonb[] DEFAULT NULL)
RETURNS SETOF pgjq.claimed
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 10
AS 'MODULE_PATHNAME', 'pgjq_complete_and_claim';
COMMENT ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[], jsonb[]) IS 'a worker''s cycle in one statement: complete (or, where errors[i] is not NULL, fail) the jobs it holds, then claim the next batch; stale tokens change nothing and are not reported';
REVOKE ALL ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[], jsonb[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[], jsonb[]) TO pgjq_worker, pgjq_admin;

/* New in 0.2.0: the consistency check (pgjq_admin only). */
CREATE FUNCTION pgjq.verify(
	OUT area text,
	OUT object text,
	OUT expected text,
	OUT found text)
RETURNS SETOF record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_verify';
COMMENT ON FUNCTION pgjq.verify() IS 'cross-check shared memory against the tables and the tables against each other; one row per disagreement, none when healthy (reads every unfinished job and the whole history)';
REVOKE ALL ON FUNCTION pgjq.verify() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.verify() TO pgjq_admin;

/* New in 0.2.0: metrics (pgjq_admin and pg_monitor). */
/*
 * Metrics for monitoring (see README "Metrics"): per-queue gauges read from
 * the tables, counters and histograms kept in shared memory since the
 * server started (absent without shared_preload_libraries, when the gauge
 * pgjq_counters_available is 0), the worker's last pass and the horizon.
 * For pgjq_admin and pg_monitor; SECURITY DEFINER because they read the
 * private tables.  A queue name is only ever a parameter.
 */
CREATE FUNCTION pgjq.metrics(queue text DEFAULT NULL,
	OUT name text,
	OUT labels jsonb,
	OUT value double precision)
RETURNS SETOF record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_metrics';
COMMENT ON FUNCTION pgjq.metrics(text) IS 'pgjq''s metrics as rows (sample name, labels, value): gauges per queue, counters since server start (shared_preload_libraries only), the worker''s last pass and the horizon age; one queue''s only when queue is given';

CREATE FUNCTION pgjq.metrics_prometheus(queue text DEFAULT NULL)
RETURNS text
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_metrics_prometheus';
COMMENT ON FUNCTION pgjq.metrics_prometheus(text) IS 'the samples of pgjq.metrics() in the Prometheus text exposition format';
REVOKE ALL ON FUNCTION pgjq.metrics(text), pgjq.metrics_prometheus(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.metrics(text), pgjq.metrics_prometheus(text) TO pgjq_admin;
GRANT USAGE ON SCHEMA pgjq TO pg_monitor;
GRANT EXECUTE ON FUNCTION pgjq.metrics(text), pgjq.metrics_prometheus(text) TO pg_monitor;

/*
 * New in 0.2.0: the ring engine (docs/design.md) holds every claimable and
 * running job.  0.1.0's scheduled and ready jobs stay in pgjq.job (promotion
 * and claims move them into the ring); its running jobs are adopted by the
 * ring below, each keeping its token, lease and cancellation request.
 */
/*
 * The ring engine (docs/design.md, "The ring engine").  Every queue keeps
 * its jobs that are due here (delayed ones wait in pgjq.job until
 * promotion appends them): each body is appended once to the current
 * slot of a ring of four tables and never updated or deleted; claims take
 * positions from shared memory (ring_shmem.c), so a claim never scans.
 * Every claim call writes one ring_log row (kind 'c': token, lease, ids),
 * every heartbeat one (kind 'h': the claim's token, the new lease, its id),
 * every cancel() of a running job one (kind 'q': the claim's token, when,
 * its id), and every call that ends ring claims one row per token (kind 'd'
 * completed, 'f' failed, snoozed or rescued: the job is then a scheduled row
 * of pgjq.job or dead or cancelled in the history, 'x' cancelled, or taken
 * out by purge or drop_queue).  A log row goes to the slot that is
 * current when it is written; a slot (body and log together) comes back by
 * TRUNCATE once it is the oldest slot in use and all its jobs are finished.
 * After a start or a crash the first ring call rebuilds shared memory from
 * these rows (ring_store.c).  Nothing here is vacuumed: the only dead tuples
 * are those of rolled-back producers, which go with the TRUNCATE.
 * attempt, priority and fair_key are NULL for their defaults (1, 0, none),
 * after_token is NULL for a job appended for the first time.
 */
CREATE TABLE pgjq.ring_body_0 (
	id				bigint NOT NULL,
	after_token		bigint,
	queue_id		integer NOT NULL,
	enqueued_at		timestamptz NOT NULL,
	attempt			integer,
	max_attempts	integer NOT NULL,
	priority		smallint,
	fair_key		text COLLATE "C",
	payload			jsonb NOT NULL,
	last_error		text,	/* of the attempt before (a promoted retry); NULL costs no byte */
	run_at			timestamptz,	/* when a promoted job fell due; NULL: enqueued_at */
	dedup_key		text COLLATE "C",	/* its anchor in pgjq.job (state 'n'); NULL: none */
	timeout			interval,	/* its own execution deadline from a claim; NULL: the queue's */
	dedup_scope		"char"	/* 'w': the claim deletes its anchor; NULL: its end does */
) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_body_1 (LIKE pgjq.ring_body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_body_2 (LIKE pgjq.ring_body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_body_3 (LIKE pgjq.ring_body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
/* job(id) and cancel(id) find a body by id; claims read bodies by position */
CREATE INDEX ring_body_0_id ON pgjq.ring_body_0 (id);
CREATE INDEX ring_body_1_id ON pgjq.ring_body_1 (id);
CREATE INDEX ring_body_2_id ON pgjq.ring_body_2 (id);
CREATE INDEX ring_body_3_id ON pgjq.ring_body_3 (id);
CREATE TABLE pgjq.ring_log_0 (
	token			bigint NOT NULL,
	at				timestamptz NOT NULL,	/* 'c', 'h': lease end; else: when */
	kind			"char" NOT NULL CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x')),
	ids				bigint[] NOT NULL,
	worker			text,	/* 'c': claim's worker argument; NULL costs no byte */
	deadline		timestamptz	/* 'c': the jobs' execution deadline (queue timeout); NULL: none */
) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_log_1 (LIKE pgjq.ring_log_0 INCLUDING CONSTRAINTS) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_log_2 (LIKE pgjq.ring_log_0 INCLUDING CONSTRAINTS) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.ring_log_3 (LIKE pgjq.ring_log_0 INCLUDING CONSTRAINTS) WITH (autovacuum_enabled = false, fillfactor = 100);
COMMENT ON TABLE pgjq.ring_body_0 IS 'ring engine: job bodies, appended once (private)';
COMMENT ON TABLE pgjq.ring_log_0 IS 'ring engine: one row per claim call and per call that ends claims (private)';
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_body_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_body_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_body_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_body_3', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.ring_log_3', '');

/*
 * 0.1.0's running jobs into the ring: a body in slot 0 (attempt: the one
 * running) and a claim row with the token and the lease; a cancellation
 * request is a 'q' row.  The first ring call rebuilds shared memory from
 * these rows (the ring's tables are new).  A job with a dedup_key keeps its
 * row as the anchor ('n').
 */
INSERT INTO pgjq.ring_body_0 (id, after_token, queue_id, enqueued_at, attempt, max_attempts,
							  priority, fair_key, payload, last_error, run_at, dedup_key)
SELECT j.id, NULL, j.queue_id, j.enqueued_at, NULLIF(j.attempt, 1), j.max_attempts,
	   NULLIF(j.priority, 0), NULLIF(j.fair_key, ''), j.payload, j.last_error, j.run_at, j.dedup_key
  FROM pgjq.job j WHERE j.state OPERATOR(pg_catalog.=) 'a' ORDER BY j.id;
INSERT INTO pgjq.ring_log_0 (token, at, kind, ids, worker)
SELECT j.token, j.lease_until, 'c', ARRAY[j.id], j.worker
  FROM pgjq.job j WHERE j.state OPERATOR(pg_catalog.=) 'a' ORDER BY j.token, j.id;
INSERT INTO pgjq.ring_log_0 (token, at, kind, ids)
SELECT j.token, pg_catalog.now(), 'q', ARRAY[j.id]
  FROM pgjq.job j WHERE j.state OPERATOR(pg_catalog.=) 'a' AND j.cancel_requested;
UPDATE pgjq.job SET state = 'n', payload = '{}', lease_until = NULL, worker = NULL,
	   last_error = NULL, cancel_requested = false
 WHERE state OPERATOR(pg_catalog.=) 'a' AND dedup_key IS NOT NULL;
DELETE FROM pgjq.job WHERE state OPERATOR(pg_catalog.=) 'a';
DROP INDEX pgjq.job_running_idx;
/* 'n': a ring job's dedup anchor (its key held in job_dedup_idx); no 'a' */
ALTER TABLE pgjq.job DROP CONSTRAINT job_state_check,
	ADD CONSTRAINT job_state_check CHECK (state IN ('s', 'r', 'n'));
COMMENT ON TABLE pgjq.job IS 'unfinished jobs outside the ring: scheduled, ready, dedup anchors (private)';

/* New in 0.2.0: job() and queue_stats see the ring's jobs. */
/*
 * Internal: the ring engine's view of a job that it holds ready or running
 * (ring_store.c); pgjq.job() asks it last.
 */
CREATE FUNCTION pgjq._ring_job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS 'MODULE_PATHNAME', 'pgjq_ring_job';

CREATE OR REPLACE FUNCTION pgjq.job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
	SELECT j.id, q.name,
		   CASE j.state WHEN 's' THEN 'scheduled' ELSE 'ready' END,
		   j.attempt, j.max_attempts, j.priority, NULLIF(j.fair_key, ''), j.dedup_key,
		   j.payload, j.enqueued_at, j.run_at, j.lease_until, NULL::timestamptz,
		   j.worker, j.last_error, j.cancel_requested, NULL::jsonb
	  FROM pgjq.job j LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) j.queue_id
	 WHERE j.id OPERATOR(pg_catalog.=) $1 AND j.state OPERATOR(pg_catalog.<>) 'n'
	UNION ALL
	SELECT h.id, q.name,
		   CASE h.state WHEN 'd' THEN 'dead' ELSE 'cancelled' END,
		   h.attempt, h.max_attempts, h.priority, NULLIF(h.fair_key, ''), h.dedup_key,
		   h.payload, h.enqueued_at, NULL, NULL, h.finished_at,
		   h.worker, h.last_error, false, NULL
	  FROM pgjq.job_history h LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) h.queue_id
	 WHERE h.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT u.id, q.name, 'completed', u.attempt, NULL, NULL, NULL, NULL,
		   NULL, u.enqueued_at, NULL, NULL, d.finished_at,
		   NULL, NULL, false, u.result
	  FROM pgjq.job_done d
	 CROSS JOIN LATERAL unnest(d.ids, d.attempts, d.enqueued_at, d.results)
			 AS u(id, attempt, enqueued_at, result)
	  LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) d.queue_id
	 WHERE d.min_id OPERATOR(pg_catalog.<=) $1 AND d.max_id OPERATOR(pg_catalog.>=) $1
	   AND u.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT * FROM pgjq._ring_job($1)
	 LIMIT 1
$$;

/* Internal: ready and running ring jobs per queue and the oldest ready one's enqueue time, from shared memory. */
CREATE FUNCTION pgjq._ring_counts(OUT queue_id integer, OUT ready bigint, OUT running bigint,
	OUT oldest_ready timestamptz)
RETURNS SETOF record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_ring_counts_sql';

/*
 * Internal: one step of giving the ring's space back, as the background
 * worker takes every pass: truncate the oldest slot if all its jobs
 * finished, else copy up to max_jobs of its unfinished jobs forward
 * (ring_store.c).  Returns the jobs copied plus the slots truncated.
 */
CREATE FUNCTION pgjq._ring_reclaim(max_jobs integer DEFAULT 1000)
RETURNS bigint
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_ring_reclaim_sql';

/* queue_stats sees the ring's jobs: defined once, at the end (it reads key_holds too) */
REVOKE ALL ON FUNCTION pgjq._ring_job(bigint), pgjq._ring_counts(), pgjq._ring_reclaim(integer)
	FROM PUBLIC;
REVOKE ALL ON pgjq.ring_body_0, pgjq.ring_body_1, pgjq.ring_body_2, pgjq.ring_body_3,
	pgjq.ring_log_0, pgjq.ring_log_1, pgjq.ring_log_2, pgjq.ring_log_3 FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq._ring_job(bigint), pgjq._ring_counts(), pgjq._ring_reclaim(integer)
	TO pgjq_admin;
GRANT EXECUTE ON FUNCTION pgjq._ring_counts() TO pgjq_producer, pgjq_worker;

/* wait_jobs(): request/response over a queue */
CREATE FUNCTION pgjq.wait_jobs(ids bigint[], wait interval, "all" boolean DEFAULT true)
RETURNS TABLE (id bigint, state text, attempt integer, result jsonb)
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_wait_jobs';
COMMENT ON FUNCTION pgjq.wait_jobs(bigint[], interval, boolean) IS 'wait until every listed job (all => false: the first one) is completed, dead or cancelled, or the wait ends (capped by pgjq.max_wait); one row per id with what job(id) says then (state NULL: no such job)';
REVOKE ALL ON FUNCTION pgjq.wait_jobs(bigint[], interval, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.wait_jobs(bigint[], interval, boolean) TO pgjq_producer, pgjq_worker, pgjq_admin;

/* a queue's execution deadline (timeout): a column, and the settings functions take it */
ALTER TABLE pgjq.queue ADD COLUMN timeout interval;
/* per-key rate limits */
ALTER TABLE pgjq.queue ADD COLUMN key_rate double precision, ADD COLUMN key_burst integer;
DROP FUNCTION pgjq.create_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer);
DROP FUNCTION pgjq.alter_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer);
DROP FUNCTION pgjq.list_queues();
CREATE FUNCTION pgjq.create_queue(
	queue text,
	lease interval DEFAULT '30 seconds',
	max_attempts integer DEFAULT 20,
	backoff_base interval DEFAULT '1 second',
	backoff_max interval DEFAULT NULL,
	retention interval DEFAULT '1 day',
	concurrency integer DEFAULT NULL,
	key_concurrency integer DEFAULT NULL,
	rate double precision DEFAULT NULL,
	burst integer DEFAULT NULL,
	timeout interval DEFAULT NULL,
	key_rate double precision DEFAULT NULL,
	key_burst integer DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_create_queue';
COMMENT ON FUNCTION pgjq.create_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer) IS 'create a queue (backoff_max defaults to the larger of 1 hour and backoff_base)';

CREATE FUNCTION pgjq.alter_queue(
	queue text,
	lease interval DEFAULT NULL,
	max_attempts integer DEFAULT NULL,
	backoff_base interval DEFAULT NULL,
	backoff_max interval DEFAULT NULL,
	retention interval DEFAULT NULL,
	concurrency integer DEFAULT NULL,
	key_concurrency integer DEFAULT NULL,
	rate double precision DEFAULT NULL,
	burst integer DEFAULT NULL,
	timeout interval DEFAULT NULL,
	key_rate double precision DEFAULT NULL,
	key_burst integer DEFAULT NULL)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_alter_queue';
COMMENT ON FUNCTION pgjq.alter_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer) IS 'change a queue''s settings; NULL leaves a setting unchanged, 0 removes a limit';

CREATE FUNCTION pgjq.list_queues(
	OUT queue text,
	OUT lease interval,
	OUT max_attempts integer,
	OUT backoff_base interval,
	OUT backoff_max interval,
	OUT retention interval,
	OUT concurrency integer,
	OUT key_concurrency integer,
	OUT rate double precision,
	OUT burst integer,
	OUT paused boolean,
	OUT created_at timestamptz,
	OUT timeout interval,
	OUT key_rate double precision,
	OUT key_burst integer)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT q.name, q.lease, q.max_attempts, q.backoff_base, q.backoff_max,
		   q.retention, q.concurrency, q.key_concurrency, q.rate, q.burst,
		   q.paused, q.created_at, q.timeout, q.key_rate, q.key_burst
	  FROM pgjq.queue q
	 ORDER BY q.name
$$;
COMMENT ON FUNCTION pgjq.list_queues() IS 'every queue and its settings';
REVOKE ALL ON FUNCTION pgjq.create_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer),
	pgjq.alter_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer),
	pgjq.list_queues() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.create_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer),
	pgjq.alter_queue(text, interval, integer, interval, interval, interval, integer, integer, double precision, integer, interval, double precision, integer),
	pgjq.list_queues() TO pgjq_admin;

/* a job's own execution deadline (timeout): kept with the job wherever it waits */
ALTER TABLE pgjq.job ADD COLUMN timeout interval;
/* a dedup_key held only until a claim (enqueue(..., dedup_scope => 'waiting')) */
ALTER TABLE pgjq.job ADD COLUMN dedup_scope "char";
ALTER TABLE pgjq.job_history ADD COLUMN timeout interval;
DROP FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer);
DROP FUNCTION pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[]);
CREATE FUNCTION pgjq.enqueue(
	queue text,
	payload jsonb DEFAULT '{}',
	delay interval DEFAULT NULL,
	run_at timestamptz DEFAULT NULL,
	priority integer DEFAULT 0,
	fair_key text DEFAULT NULL,
	dedup_key text DEFAULT NULL,
	max_attempts integer DEFAULT NULL,
	timeout interval DEFAULT NULL,
	dedup_scope text DEFAULT NULL,
	dedup_for interval DEFAULT NULL,
	on_duplicate text DEFAULT NULL,
	debounce_max interval DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_enqueue';
COMMENT ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval) IS 'add one job; returns its id (or the existing job''s id for a duplicate dedup_key)';

CREATE FUNCTION pgjq.enqueue_many(
	queue text,
	payloads jsonb[],
	delay interval DEFAULT NULL,
	run_at timestamptz DEFAULT NULL,
	priority integer DEFAULT 0,
	fair_keys text[] DEFAULT NULL,
	dedup_keys text[] DEFAULT NULL,
	timeout interval DEFAULT NULL,
	dedup_scope text DEFAULT NULL,
	dedup_for interval DEFAULT NULL,
	on_duplicate text DEFAULT NULL,
	debounce_max interval DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'pgjq_enqueue_many';
COMMENT ON FUNCTION pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval) IS 'add many jobs in one statement; returns their ids in input order';
REVOKE ALL ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval),
	pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval),
	pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval) TO pgjq_producer, pgjq_admin;

/*
 * Dedup keys held for a period from an enqueue (enqueue(..., dedup_for)),
 * whatever becomes of the job: a duplicate until `until` gets job_id.  The
 * worker deletes the rows that ended; a later enqueue takes over one that
 * ended before the worker came by.
 */
CREATE TABLE pgjq.dedup_period (
	queue_id		integer NOT NULL,
	dedup_key		text COLLATE "C" NOT NULL,
	job_id			bigint NOT NULL,
	until			timestamptz NOT NULL,
	PRIMARY KEY (queue_id, dedup_key)
);
CREATE INDEX dedup_period_until_idx ON pgjq.dedup_period (until);
COMMENT ON TABLE pgjq.dedup_period IS 'dedup keys held for a period from an enqueue (private: use enqueue(..., dedup_for))';
SELECT pg_catalog.pg_extension_config_dump('pgjq.dedup_period', '');
REVOKE ALL ON pgjq.dedup_period FROM PUBLIC;

/*
 * Periodic jobs (src/schedule.c): one row per schedule, with the next slot
 * to fire.  The worker fires due slots in the transaction that moves
 * next_slot on, so each slot is enqueued exactly once.
 */
CREATE TABLE pgjq.schedules (
	name			text NOT NULL PRIMARY KEY,
	cron			text NOT NULL,
	queue			text NOT NULL,
	payload			jsonb NOT NULL,
	time_zone		text NOT NULL,
	catch_up		text NOT NULL CHECK (catch_up IN ('none', 'one', 'all')),
	next_slot		timestamptz NOT NULL,
	last_slot		timestamptz,	/* the latest slot enqueued */
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgjq.schedules IS 'periodic jobs: one row per schedule (private: use schedule(), unschedule(), list_schedules())';
SELECT pg_catalog.pg_extension_config_dump('pgjq.schedules', '');

/* ------------------------------------------------------- periodic jobs */

CREATE FUNCTION pgjq.schedule(
	name text,
	cron text,
	queue text,
	payload jsonb DEFAULT '{}',
	time_zone text DEFAULT 'UTC',
	catch_up text DEFAULT 'one')
RETURNS timestamptz
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_schedule';
COMMENT ON FUNCTION pgjq.schedule(text, text, text, jsonb, text, text) IS 'create or replace a periodic job: one job per slot of the cron expression, in time_zone; returns the first slot';

CREATE FUNCTION pgjq.unschedule(name text)
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_unschedule';
COMMENT ON FUNCTION pgjq.unschedule(text) IS 'remove a schedule; false if there was none';

CREATE FUNCTION pgjq.list_schedules(
	OUT name text,
	OUT cron text,
	OUT queue text,
	OUT payload jsonb,
	OUT time_zone text,
	OUT catch_up text,
	OUT next_slot timestamptz,
	OUT last_slot timestamptz,
	OUT created_at timestamptz)
RETURNS SETOF record
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT s.name, s.cron, s.queue, s.payload, s.time_zone, s.catch_up, s.next_slot,
		   s.last_slot, s.created_at
	  FROM pgjq.schedules s
	 ORDER BY s.name
$$;
COMMENT ON FUNCTION pgjq.list_schedules() IS 'every schedule, its next slot and the last one enqueued';

/* Internal: the next n slots of a cron expression after a time (tests, previews). */
CREATE FUNCTION pgjq._cron_slots(cron text, time_zone text, after timestamptz, n integer)
RETURNS SETOF timestamptz
LANGUAGE C STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_cron_slots';

/* Internal: fire the due schedules now, in the caller's transaction (the worker does it). */
CREATE FUNCTION pgjq._fire_schedules()
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_fire_schedules';
REVOKE ALL ON pgjq.schedules FROM PUBLIC;
REVOKE ALL ON FUNCTION pgjq.schedule(text, text, text, jsonb, text, text), pgjq.unschedule(text),
	pgjq.list_schedules(), pgjq._cron_slots(text, text, timestamptz, integer), pgjq._fire_schedules()
	FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.schedule(text, text, text, jsonb, text, text), pgjq.unschedule(text),
	pgjq.list_schedules(), pgjq._cron_slots(text, text, timestamptz, integer), pgjq._fire_schedules()
	TO pgjq_admin;

/*
 * Held fair keys (src/key_hold.c): claims skip a held key's ready jobs until
 * `until`.  One row per held key; shared memory takes a change at commit and
 * reloads the rows after a start or a crash.
 */
CREATE TABLE pgjq.key_holds (
	queue_id		integer NOT NULL,
	fair_key		text COLLATE "C" NOT NULL,	/* '': the jobs without a fair key */
	until			timestamptz NOT NULL,
	PRIMARY KEY (queue_id, fair_key)
);
COMMENT ON TABLE pgjq.key_holds IS 'fair keys held until a time (private: use hold_key(), release_key(), fail(..., hold_key_for))';
SELECT pg_catalog.pg_extension_config_dump('pgjq.key_holds', '');

DROP FUNCTION pgjq.fail(bigint, bigint, text, interval);
CREATE FUNCTION pgjq.fail(id bigint, token bigint, error text DEFAULT NULL, retry_in interval DEFAULT NULL,
						  hold_key_for interval DEFAULT NULL)
RETURNS text
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_fail';
COMMENT ON FUNCTION pgjq.fail(bigint, bigint, text, interval, interval) IS 'report a failed attempt: ''retry'', ''dead'' or ''stale''; hold_key_for also holds the job''s fair key that long (a 429 with Retry-After)';

CREATE FUNCTION pgjq.hold_key(queue text, fair_key text, until timestamptz)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_hold_key';
COMMENT ON FUNCTION pgjq.hold_key(text, text, timestamptz) IS 'claims skip the queue''s jobs of fair_key (NULL: the jobs without one) until then, without touching them';

CREATE FUNCTION pgjq.release_key(queue text, fair_key text)
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_release_key';
COMMENT ON FUNCTION pgjq.release_key(text, text) IS 'end a hold_key(); false when the key was not held';
REVOKE ALL ON pgjq.key_holds FROM PUBLIC;
REVOKE ALL ON FUNCTION pgjq.fail(bigint, bigint, text, interval, interval), pgjq.hold_key(text, text, timestamptz),
	pgjq.release_key(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.fail(bigint, bigint, text, interval, interval), pgjq.hold_key(text, text, timestamptz),
	pgjq.release_key(text, text) TO pgjq_worker, pgjq_admin;
/* Dependencies (enqueue(..., after)): waiting jobs ('w') and their open edges */
ALTER TABLE pgjq.job DROP CONSTRAINT job_state_check,
	ADD CONSTRAINT job_state_check CHECK (state IN ('s', 'r', 'n', 'w'));
ALTER TABLE pgjq.job ADD COLUMN deps_left integer;
ALTER TABLE pgjq.job ADD COLUMN on_dep_failure "char";
COMMENT ON TABLE pgjq.job IS 'unfinished jobs outside the ring: scheduled, ready, waiting for dependencies, dedup anchors (private)';
/* metrics() counts waiting jobs per queue on it, as the others on theirs */
CREATE INDEX job_waiting_idx ON pgjq.job (queue_id) WHERE state = 'w';
/*
 * Dependencies (enqueue(..., after)): job_id waits in pgjq.job (state 'w')
 * until depends_on has finished.  The background worker deletes an edge when
 * its depends_on finishes (src/deps.c), so the rows are the edges still open.
 */
CREATE TABLE pgjq.job_dependency (
	depends_on		bigint NOT NULL,
	job_id			bigint NOT NULL,
	PRIMARY KEY (depends_on, job_id)
);
CREATE INDEX job_dependency_job_idx ON pgjq.job_dependency (job_id);
COMMENT ON TABLE pgjq.job_dependency IS 'open dependencies of waiting jobs (private)';
SELECT pg_catalog.pg_extension_config_dump('pgjq.job_dependency', '');
REVOKE ALL ON pgjq.job_dependency FROM PUBLIC;
ALTER TYPE pgjq.job_info ADD ATTRIBUTE waiting_for bigint[];
CREATE OR REPLACE FUNCTION pgjq.job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
	SELECT j.id, q.name,
		   CASE j.state WHEN 's' THEN 'scheduled' WHEN 'w' THEN 'waiting' ELSE 'ready' END,
		   j.attempt, j.max_attempts, j.priority, NULLIF(j.fair_key, ''), j.dedup_key,
		   j.payload, j.enqueued_at, j.run_at, j.lease_until, NULL::timestamptz,
		   j.worker, j.last_error, j.cancel_requested, NULL::jsonb,
		   CASE WHEN j.state OPERATOR(pg_catalog.=) 'w' THEN
				ARRAY(SELECT d.depends_on FROM pgjq.job_dependency d
					   WHERE d.job_id OPERATOR(pg_catalog.=) j.id ORDER BY 1) END
	  FROM pgjq.job j LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) j.queue_id
	 WHERE j.id OPERATOR(pg_catalog.=) $1 AND j.state OPERATOR(pg_catalog.<>) 'n'
	UNION ALL
	SELECT h.id, q.name,
		   CASE h.state WHEN 'd' THEN 'dead' ELSE 'cancelled' END,
		   h.attempt, h.max_attempts, h.priority, NULLIF(h.fair_key, ''), h.dedup_key,
		   h.payload, h.enqueued_at, NULL, NULL, h.finished_at,
		   h.worker, h.last_error, false, NULL, NULL
	  FROM pgjq.job_history h LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) h.queue_id
	 WHERE h.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT u.id, q.name, 'completed', u.attempt, NULL, NULL, NULL, NULL,
		   NULL, u.enqueued_at, NULL, NULL, d.finished_at,
		   NULL, NULL, false, u.result, NULL
	  FROM pgjq.job_done d
	 CROSS JOIN LATERAL unnest(d.ids, d.attempts, d.enqueued_at, d.results)
			 AS u(id, attempt, enqueued_at, result)
	  LEFT JOIN pgjq.queue q ON q.queue_id OPERATOR(pg_catalog.=) d.queue_id
	 WHERE d.min_id OPERATOR(pg_catalog.<=) $1 AND d.max_id OPERATOR(pg_catalog.>=) $1
	   AND u.id OPERATOR(pg_catalog.=) $1
	UNION ALL
	SELECT * FROM pgjq._ring_job($1)
	 LIMIT 1
$$;
DROP FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval);
DROP FUNCTION pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval);
CREATE FUNCTION pgjq.enqueue(
	queue text,
	payload jsonb DEFAULT '{}',
	delay interval DEFAULT NULL,
	run_at timestamptz DEFAULT NULL,
	priority integer DEFAULT 0,
	fair_key text DEFAULT NULL,
	dedup_key text DEFAULT NULL,
	max_attempts integer DEFAULT NULL,
	timeout interval DEFAULT NULL,
	dedup_scope text DEFAULT NULL,
	dedup_for interval DEFAULT NULL,
	on_duplicate text DEFAULT NULL,
	debounce_max interval DEFAULT NULL,
	after bigint[] DEFAULT NULL,
	on_dependency_failure text DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_enqueue';
COMMENT ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval, bigint[], text) IS 'add one job; returns its id (or the existing job''s id for a duplicate dedup_key)';

CREATE FUNCTION pgjq.enqueue_many(
	queue text,
	payloads jsonb[],
	delay interval DEFAULT NULL,
	run_at timestamptz DEFAULT NULL,
	priority integer DEFAULT 0,
	fair_keys text[] DEFAULT NULL,
	dedup_keys text[] DEFAULT NULL,
	timeout interval DEFAULT NULL,
	dedup_scope text DEFAULT NULL,
	dedup_for interval DEFAULT NULL,
	on_duplicate text DEFAULT NULL,
	debounce_max interval DEFAULT NULL,
	after jsonb[] DEFAULT NULL,
	on_dependency_failure text DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 100
AS 'MODULE_PATHNAME', 'pgjq_enqueue_many';
COMMENT ON FUNCTION pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval, jsonb[], text) IS 'add many jobs in one statement; returns their ids in input order';
REVOKE ALL ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval, bigint[], text),
	pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval, jsonb[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval, bigint[], text),
	pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval, jsonb[], text) TO pgjq_producer, pgjq_admin;

CREATE OR REPLACE VIEW pgjq.queue_stats WITH (security_barrier) AS
	SELECT q.name AS queue,
		   q.paused,
		   COALESCE(u.ready, 0) OPERATOR(pg_catalog.+) COALESCE(r.ready, 0) AS ready,
		   COALESCE(u.scheduled, 0) AS scheduled,
		   COALESCE(r.running, 0) AS running,
		   COALESCE(f.dead, 0) AS dead,
		   COALESCE(c.completed, 0)::bigint AS completed,
		   COALESCE(f.cancelled, 0) AS cancelled,
		   pg_catalog.now() OPERATOR(pg_catalog.-) LEAST(u.oldest_ready, r.oldest_ready) AS oldest_ready_age,
		   u.next_run_at,
		   q.concurrency,
		   q.key_concurrency,
		   q.rate,
		   CASE WHEN pgjq._preloaded() THEN COALESCE(l.held_back, 0) END AS held_back,
		   COALESCE(k.held_keys, 0) AS held_keys,
		   q.key_rate,
		   COALESCE(u.waiting, 0) AS waiting
	  FROM pgjq.queue q
	  LEFT JOIN pgjq._limits() l ON l.queue_id OPERATOR(pg_catalog.=) q.queue_id
	  LEFT JOIN pgjq._ring_counts() r ON r.queue_id OPERATOR(pg_catalog.=) q.queue_id
	  LEFT JOIN (SELECT j.queue_id,
						pg_catalog.count(*) FILTER (WHERE j.state OPERATOR(pg_catalog.=) 'r') AS ready,
						pg_catalog.count(*) FILTER (WHERE j.state OPERATOR(pg_catalog.=) 's') AS scheduled,
						pg_catalog.min(j.run_at) FILTER (WHERE j.state OPERATOR(pg_catalog.=) 'r') AS oldest_ready,
						pg_catalog.min(j.run_at) FILTER (WHERE j.state OPERATOR(pg_catalog.=) 's') AS next_run_at,
						pg_catalog.count(*) FILTER (WHERE j.state OPERATOR(pg_catalog.=) 'w') AS waiting
				   FROM pgjq.job j GROUP BY j.queue_id) u ON u.queue_id OPERATOR(pg_catalog.=) q.queue_id
	  LEFT JOIN (SELECT d.queue_id, pg_catalog.sum(pg_catalog.cardinality(d.ids)) AS completed
				   FROM pgjq.job_done d GROUP BY d.queue_id) c ON c.queue_id OPERATOR(pg_catalog.=) q.queue_id
	  LEFT JOIN (SELECT h.queue_id,
						pg_catalog.count(*) FILTER (WHERE h.state OPERATOR(pg_catalog.=) 'd') AS dead,
						pg_catalog.count(*) FILTER (WHERE h.state OPERATOR(pg_catalog.=) 'x') AS cancelled
				   FROM pgjq.job_history h GROUP BY h.queue_id) f ON f.queue_id OPERATOR(pg_catalog.=) q.queue_id
	  LEFT JOIN (SELECT kh.queue_id, pg_catalog.count(*) AS held_keys FROM pgjq.key_holds kh
				  WHERE kh.until OPERATOR(pg_catalog.>) pg_catalog.now() GROUP BY kh.queue_id) k
			 ON k.queue_id OPERATOR(pg_catalog.=) q.queue_id;
COMMENT ON VIEW pgjq.queue_stats IS 'per queue: jobs in each state (waiting: for dependencies), the age of the oldest ready job, its limits and how many claims the limits cut short since the server started (NULL without shared_preload_libraries)';
