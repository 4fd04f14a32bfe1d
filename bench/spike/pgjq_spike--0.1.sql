/*
 * bench/spike/pgjq_spike--0.1.sql: the stage-1 spike of pgjq's target engine
 * (issue 7).  Throwaway: one queue, one lane, no history, no rescue.  It
 * installs a schema pgjq with the function names and result columns that
 * the scripts in bench/scripts call, so the same pgbench scripts drive it, the
 * baseline and pgjq.  Run it in a database of its own, preloaded
 * (shared_preload_libraries = 'pgjq_spike').
 */
\echo Use "CREATE EXTENSION pgjq_spike" to load this file. \quit

/*
 * The body ring: jobs are appended once and never updated or deleted; a slot
 * comes back by TRUNCATE when every job in it is finished.  A retry (fail) or
 * a rescue of an expired lease appends a new version of the job (same id,
 * attempt + 1, after_token = the claim it closed); the newest version is the
 * job.  after_token and attempt are NULL for a new job, which costs nothing:
 * with seven columns the null bitmap fits the header's 24 bytes.  autovacuum is off: there is
 * nothing to vacuum (no dead tuples but those of rolled-back producers, which
 * go with the TRUNCATE), and insert-driven vacuum or analyze would only cost.
 */
CREATE TABLE pgjq.body_0 (
	id				bigint NOT NULL,
	after_token		bigint,			/* a re-append: the claim it closed; NULL for a new job */
	enqueued_at		timestamptz NOT NULL,
	attempt			integer,		/* NULL = 1 */
	priority		smallint,		/* NULL = 0; lower runs first */
	fair_key		text,			/* NULL = none */
	payload			jsonb NOT NULL
) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.body_1 (LIKE pgjq.body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.body_2 (LIKE pgjq.body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
CREATE TABLE pgjq.body_3 (LIKE pgjq.body_0) WITH (autovacuum_enabled = false, fillfactor = 100);
/*
 * job(id)-style lookups need an index on id; claims never use it (they read
 * bodies by TID).  bench/spike/run measures with and without it.
 */
CREATE INDEX body_0_id ON pgjq.body_0 (id);
CREATE INDEX body_1_id ON pgjq.body_1 (id);
CREATE INDEX body_2_id ON pgjq.body_2 (id);
CREATE INDEX body_3_id ON pgjq.body_3 (id);

/*
 * one row per claim call that claimed something (kind NULL), and one per
 * heartbeat (kind 'h': the lease of that token's jobs moved to lease_until)
 */
CREATE TABLE pgjq.ledger (
	token			bigint NOT NULL,
	lease_until		timestamptz NOT NULL,
	kind			"char",
	ids				bigint[] NOT NULL
) WITH (autovacuum_enabled = false, fillfactor = 100);

/*
 * one row per outcome call that closed something; tokens has one element
 * when every closed job came from the same claim (the usual case).  kind
 * NULL: completed; 'f': failed and appended again; 'r': lease expired,
 * rescued and appended again.
 */
CREATE TABLE pgjq.done (
	finished_at		timestamptz NOT NULL,
	kind			"char",
	tokens			bigint[] NOT NULL,
	ids				bigint[] NOT NULL
) WITH (autovacuum_enabled = false, fillfactor = 100);

/*
 * delayed jobs: not in the ring (a job due in 30 days must not pin a slot);
 * pgjq.promote() moves due rows into the ring (DELETE here, so dead tuples
 * only on the delayed path, vacuumed as usual)
 */
CREATE TABLE pgjq.sched (
	run_at			timestamptz NOT NULL,
	id				bigint NOT NULL,
	after_token		bigint,
	enqueued_at		timestamptz NOT NULL,
	attempt			integer,
	priority		smallint,
	fair_key		text,
	payload			jsonb NOT NULL
);
CREATE INDEX sched_run_at ON pgjq.sched (run_at);

CREATE SEQUENCE pgjq.job_id_seq AS bigint;
CREATE SEQUENCE pgjq.token_seq AS bigint;

CREATE TYPE pgjq.claimed AS (
	id				bigint,
	token			bigint,
	attempt			integer,
	payload			jsonb,
	enqueued_at		timestamptz,
	lease_until		timestamptz
);

CREATE FUNCTION pgjq.enqueue(queue text, payload jsonb DEFAULT '{}', priority integer DEFAULT 0,
							 fair_key text DEFAULT NULL, run_at timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE c AS 'MODULE_PATHNAME', 'spike_enqueue';

CREATE FUNCTION pgjq.enqueue_many(queue text, payloads jsonb[], priority integer DEFAULT 0,
								  fair_key text DEFAULT NULL)
RETURNS SETOF bigint LANGUAGE c AS 'MODULE_PATHNAME', 'spike_enqueue_many';

/* wait: sleep up to this long for a job (woken by the commit that publishes it) */
CREATE FUNCTION pgjq.claim(queue text, batch integer DEFAULT 1, lease interval DEFAULT '5 min',
						   wait interval DEFAULT NULL)
RETURNS SETOF pgjq.claimed LANGUAGE c ROWS 10 AS 'MODULE_PATHNAME', 'spike_claim';

CREATE FUNCTION pgjq.complete(id bigint, token bigint)
RETURNS boolean LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'spike_complete_one';

CREATE FUNCTION pgjq.complete(ids bigint[], tokens bigint[])
RETURNS bigint LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'spike_complete';

CREATE FUNCTION pgjq.complete_and_claim(queue text, ids bigint[], tokens bigint[],
										batch integer DEFAULT 1, lease interval DEFAULT '5 min')
RETURNS SETOF pgjq.claimed LANGUAGE c STRICT ROWS 10 AS 'MODULE_PATHNAME', 'spike_complete_and_claim';

CREATE FUNCTION pgjq.fail(id bigint, token bigint, error text DEFAULT NULL)
RETURNS boolean LANGUAGE c AS 'MODULE_PATHNAME', 'spike_fail';

CREATE FUNCTION pgjq.heartbeat(id bigint, token bigint, extend interval DEFAULT '5 min')
RETURNS timestamptz LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'spike_heartbeat';

/*
 * the background worker's promotion pass: sleeps up to wait until a job is
 * due, then moves up to max_jobs due jobs into the ring
 */
CREATE FUNCTION pgjq.promote(max_jobs integer DEFAULT 1000, wait interval DEFAULT '0')
RETURNS bigint LANGUAGE c AS 'MODULE_PATHNAME', 'spike_promote';

/* what the background worker would do: re-append jobs whose lease expired */
CREATE FUNCTION pgjq.rescue(max_jobs integer DEFAULT 1000)
RETURNS bigint LANGUAGE c STRICT AS 'MODULE_PATHNAME', 'spike_rescue';

/*
 * the shared-memory state rebuilt from the tables (the first call after a
 * restart does it by itself); returns the milliseconds it took
 */
CREATE FUNCTION pgjq.spike_rebuild(
	OUT ms double precision, OUT ready bigint, OUT in_flight bigint, OUT body_rows bigint)
RETURNS record LANGUAGE c AS 'MODULE_PATHNAME', 'spike_rebuild';

/* empty every table and the shared-memory state (no other session may be active) */
CREATE FUNCTION pgjq.spike_reset()
RETURNS void LANGUAGE c AS 'MODULE_PATHNAME', 'spike_reset';

CREATE FUNCTION pgjq.spike_stats(
	OUT ready bigint, OUT in_flight bigint, OUT published bigint, OUT claimed bigint,
	OUT completed bigint, OUT stale bigint, OUT returned bigint, OUT truncations bigint,
	OUT ring_full bigint, OUT rescued bigint, OUT failed bigint, OUT rebuilds bigint, OUT relocated bigint,
	OUT cur_slot integer, OUT slot_open bigint[], OUT slot_appended bigint[], OUT lanes bigint,
	OUT promoted bigint)
RETURNS record LANGUAGE c AS 'MODULE_PATHNAME', 'spike_stats';

/* what bench/run's helpers read: jobs not finished */
CREATE VIEW pgjq.queue_stats AS
	SELECT 'spike'::text AS queue, s.ready, 0::bigint AS scheduled, s.in_flight AS running,
		   0::bigint AS dead, s.completed
	  FROM pgjq.spike_stats() s;
