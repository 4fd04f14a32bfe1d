/*
 * pgjq: update from 0.1.0 to 0.2.0 (ALTER EXTENSION pgjq UPDATE).
 *
 * 0.2.0 hardens 0.1.0 (see CHANGELOG.md); its tables are those of 0.1.0, so
 * no data moves.  Every object whose definition changed is redefined here,
 * so that an updated installation is the same as a new one: the upgrade
 * test (test/t/070_upgrade_dump.pl) compares the two schemas object by object.
 */

\echo Use "ALTER EXTENSION pgjq UPDATE TO '0.2.0'" to load this file. \quit

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

/* New in 0.2.0: a worker's cycle in one statement (pgjq_worker). */
CREATE FUNCTION pgjq.complete_and_claim(
	queue text,
	ids bigint[],
	tokens bigint[],
	batch integer DEFAULT 1,
	lease interval DEFAULT NULL,
	worker text DEFAULT NULL,
	errors text[] DEFAULT NULL)
RETURNS SETOF pgjq.claimed
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 10
AS 'MODULE_PATHNAME', 'pgjq_complete_and_claim';
COMMENT ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[]) IS 'a worker''s cycle in one statement: complete (or, where errors[i] is not NULL, fail) the jobs it holds, then claim the next batch; stale tokens change nothing and are not reported';
REVOKE ALL ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[]) TO pgjq_worker, pgjq_admin;

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
