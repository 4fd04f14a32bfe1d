/*
 * pgjq: a job queue inside PostgreSQL.
 *
 * This script is the whole schema of the current version; the Makefile
 * copies it to pgjq--<default_version>.sql.  Everything user-visible lives in
 * schema pgjq.  Tables are private: no role but the extension owner touches
 * them; the API functions are SECURITY DEFINER with a fixed search_path and
 * check their arguments in C.  Nothing is granted to PUBLIC: the three
 * NOLOGIN roles pgjq_producer, pgjq_worker and pgjq_admin carry the
 * privileges (see README.md, "Privileges").
 */

\echo Use "CREATE EXTENSION pgjq" to load this file. \quit

/*
 * pgjq keeps its queues' claimable jobs in shared memory (the ring engine):
 * without shared_preload_libraries the extension is refused here, with a
 * hint, rather than at the first enqueue.
 */
CREATE FUNCTION pgjq._require_preload() RETURNS void
	LANGUAGE c VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
	AS 'MODULE_PATHNAME', 'pgjq_require_preload';
REVOKE ALL ON FUNCTION pgjq._require_preload() FROM PUBLIC;
SELECT pgjq._require_preload();

/* ---------------------------------------------------------------- roles */

DO $roles$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjq_producer') THEN
		CREATE ROLE pgjq_producer NOLOGIN;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjq_worker') THEN
		CREATE ROLE pgjq_worker NOLOGIN;
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'pgjq_admin') THEN
		CREATE ROLE pgjq_admin NOLOGIN;
	END IF;
END
$roles$;

REVOKE ALL ON SCHEMA pgjq FROM PUBLIC;
GRANT USAGE ON SCHEMA pgjq TO pgjq_producer, pgjq_worker, pgjq_admin;

/* --------------------------------------------------------------- tables */

CREATE TABLE pgjq.queue (
	queue_id		integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	name			text NOT NULL UNIQUE,
	lease			interval NOT NULL,
	max_attempts	integer NOT NULL,
	backoff_base	interval NOT NULL,
	backoff_max		interval NOT NULL,
	retention		interval NOT NULL,
	concurrency		integer,
	key_concurrency	integer,
	rate			double precision,
	burst			integer,
	paused			boolean NOT NULL DEFAULT false,
	created_at		timestamptz NOT NULL DEFAULT pg_catalog.now(),
	timeout			interval,	/* a job's execution deadline from its claim; NULL: none */
	key_rate		double precision,	/* claims per second per fair key; NULL: none */
	key_burst		integer		/* its bucket; NULL: the larger of 1 and key_rate */
);
COMMENT ON TABLE pgjq.queue IS 'one row per queue and its settings (private: use the pgjq functions)';

CREATE SEQUENCE pgjq.job_id_seq AS bigint;
CREATE SEQUENCE pgjq.token_seq AS bigint;

/*
 * The unfinished jobs that are not in the ring: scheduled ('s': delayed, or
 * a retry or snooze until due) and ready ('r': redriven dead jobs, or a
 * backlog the ring had no room for, until a claim moves them into the
 * ring); and 'n', the dedup anchor of a ring job with a dedup_key (same id
 * and key, no payload; it goes when the job finishes), so that one partial
 * unique index decides every dedup_key.  Running jobs are the ring's only.
 * token is the claim a retry or snooze came from; lease_until, worker and
 * cancel_requested are unused since 0.2.0 (kept so 0.1.0's rows update in
 * place).
 */
CREATE TABLE pgjq.job (
	id				bigint NOT NULL PRIMARY KEY,
	queue_id		integer NOT NULL,
	state			"char" NOT NULL CHECK (state IN ('s', 'r', 'n', 'w')),
	priority		smallint NOT NULL,
	fair_key		text COLLATE "C" NOT NULL,
	dedup_key		text,
	attempt			integer NOT NULL,
	max_attempts	integer NOT NULL,
	token			bigint NOT NULL,
	enqueued_at		timestamptz NOT NULL,
	run_at			timestamptz NOT NULL,
	lease_until		timestamptz,
	worker			text,
	last_error		text,
	cancel_requested boolean NOT NULL,
	payload			jsonb NOT NULL,
	timeout			interval,	/* its own execution deadline; NULL: the queue's */
	dedup_scope		"char",	/* 'w': its dedup_key is held only until a claim; NULL: until it ends */
	deps_left		integer,	/* state 'w': dependencies not finished yet */
	on_dep_failure	"char"	/* state 'w': 'r' runs it when a dependency ends dead or cancelled; NULL: cancelled */
);
COMMENT ON TABLE pgjq.job IS 'unfinished jobs outside the ring: scheduled, ready, waiting for dependencies, dedup anchors (private)';

CREATE INDEX job_ready_idx ON pgjq.job (queue_id, priority, fair_key, id) WHERE state = 'r';
CREATE INDEX job_scheduled_idx ON pgjq.job (run_at) WHERE state = 's';
/* metrics() counts waiting jobs per queue on it, as the others on theirs */
CREATE INDEX job_waiting_idx ON pgjq.job (queue_id) WHERE state = 'w';
CREATE UNIQUE INDEX job_dedup_idx ON pgjq.job (queue_id, dedup_key) WHERE dedup_key IS NOT NULL;

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

/*
 * Finished jobs live in two tables, both range partitioned by finished_at in
 * one-hour partitions (UTC), so prune() only ever truncates and drops whole
 * partitions: once the longest retention among the queues with rows in a
 * partition has passed since its end.  Partitions are created ahead by
 * maintenance and on demand by the finishing call (src/storage_history.c);
 * pgjq.history_partition lists them.
 *
 * pgjq.job_done: completed jobs, one compact row per complete() call and
 * queue (ids, attempts and enqueue times as arrays), so a batch of n
 * completions writes one small tuple instead of n; BRIN on the id range finds
 * a job for pgjq.job() at no WAL cost per insert.
 *
 * pgjq.job_history: dead ('d') and cancelled ('x') jobs, one row each, with
 * everything needed to look at them and, for dead jobs, the payload that
 * retry_dead() runs again.
 */
CREATE TABLE pgjq.job_done (
	queue_id		integer NOT NULL,
	finished_at		timestamptz NOT NULL,
	min_id			bigint NOT NULL,
	max_id			bigint NOT NULL,
	ids				bigint[] NOT NULL,
	attempts		integer[] NOT NULL,
	enqueued_at		timestamptz[] NOT NULL,
	results			jsonb[]	/* NULL when the call gave none; else results[i] is ids[i]'s */
) PARTITION BY RANGE (finished_at);
COMMENT ON TABLE pgjq.job_done IS 'completed jobs, one row per completing call and queue, in hourly partitions (private)';

/*
 * Neither history table has indexes of its own: each hourly partition gets
 * them when it is created (a BRIN on (min_id, max_id) here; (id) and the
 * dead jobs' (queue_id) in job_history).  A partitioned index would make
 * pg_restore fail: it attaches each dumped partition, which creates the
 * partition's index from the parent's, then creates the dumped one again.
 */

CREATE TABLE pgjq.job_history (
	id				bigint NOT NULL,
	queue_id		integer NOT NULL,
	state			"char" NOT NULL CHECK (state IN ('d', 'x')),
	priority		smallint NOT NULL,
	fair_key		text COLLATE "C" NOT NULL,
	dedup_key		text,
	attempt			integer NOT NULL,
	max_attempts	integer NOT NULL,
	token			bigint NOT NULL,
	enqueued_at		timestamptz NOT NULL,
	finished_at		timestamptz NOT NULL,
	worker			text,
	last_error		text,
	payload			jsonb,
	timeout			interval	/* a dead job's own timeout, for retry_dead */
) PARTITION BY RANGE (finished_at);
COMMENT ON TABLE pgjq.job_history IS 'dead and cancelled jobs, in hourly partitions by finish time (private)';


/*
 * One row per history partition (of either table).  queue_ids is filled once
 * the partition's hour has passed (it can no longer receive rows), so prune()
 * learns which queues' retention applies without scanning it again.
 */
CREATE TABLE pgjq.history_partition (
	relname			name NOT NULL PRIMARY KEY,
	parent			name NOT NULL,
	lower_bound		timestamptz NOT NULL,
	upper_bound		timestamptz NOT NULL,
	queue_ids		integer[]
);
COMMENT ON TABLE pgjq.history_partition IS 'the partitions of pgjq.job_done and pgjq.job_history (private)';

SELECT pg_catalog.pg_extension_config_dump('pgjq.queue', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.job', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.job_dependency', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.job_history', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.job_done', '');

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
SELECT pg_catalog.pg_extension_config_dump('pgjq.history_partition', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.job_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pgjq.token_seq', '');

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
 * out by purge or drop_queue), 'r' the ids of relocated copies written
 * to this slot, and 'g' (token: the slot's generation, no ids) written
 * with the first rows of each turn of the slot: the ring's order, which
 * the rebuild reads instead of guessing it.  A log row goes to the slot that is
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
	kind			"char" NOT NULL CHECK (kind IN ('c', 'h', 'q', 'd', 'f', 'x', 'r', 'g')),
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

/* ---------------------------------------------------------------- types */

CREATE TYPE pgjq.claimed AS (
	id				bigint,
	token			bigint,
	attempt			integer,
	payload			jsonb,
	fair_key		text,
	priority		smallint,
	enqueued_at		timestamptz,
	lease_until		timestamptz
);
COMMENT ON TYPE pgjq.claimed IS 'a job handed to a worker by pgjq.claim(): run it, then report its outcome with (id, token)';

/* --------------------------------------------------------------- queues */

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

CREATE FUNCTION pgjq.drop_queue(queue text, force boolean DEFAULT false)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_drop_queue';
COMMENT ON FUNCTION pgjq.drop_queue(text, boolean) IS 'drop a queue and all its jobs; refuses while jobs run unless force';

CREATE FUNCTION pgjq.pause(queue text)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_pause';
COMMENT ON FUNCTION pgjq.pause(text) IS 'stop handing out a queue''s jobs (claims return nothing)';

CREATE FUNCTION pgjq.resume(queue text)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_resume';
COMMENT ON FUNCTION pgjq.resume(text) IS 'hand out a paused queue''s jobs again';

CREATE FUNCTION pgjq.purge(queue text)
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_purge';
COMMENT ON FUNCTION pgjq.purge(text) IS 'remove a queue''s ready and scheduled jobs; returns how many';

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

/* -------------------------------------------------------------- enqueue */

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

/* ---------------------------------------------------------------- claim */

CREATE FUNCTION pgjq.claim(
	queue text,
	batch integer DEFAULT 1,
	lease interval DEFAULT NULL,
	worker text DEFAULT NULL,
	wait interval DEFAULT NULL)
RETURNS SETOF pgjq.claimed
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 10
AS 'MODULE_PATHNAME', 'pgjq_claim';
COMMENT ON FUNCTION pgjq.claim(text, integer, interval, text, interval) IS 'lease up to batch ready jobs: smaller priority first, round-robin across fair keys, then oldest first; with wait, sleep until a job is claimable';

CREATE FUNCTION pgjq.claim(
	queues text[],
	batch integer DEFAULT 1,
	lease interval DEFAULT NULL,
	worker text DEFAULT NULL,
	wait interval DEFAULT NULL)
RETURNS SETOF pgjq.claimed
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 10
AS 'MODULE_PATHNAME', 'pgjq_claim_many';
COMMENT ON FUNCTION pgjq.claim(text[], integer, interval, text, interval) IS 'claim from several queues in the array''s order; a wait wakes on any of them';

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

/*
 * await() is SECURITY INVOKER without SET: PostgreSQL allows transaction
 * control (which it needs to sleep without a snapshot) only then.  It touches
 * no table itself; these two definer helpers do, called by qualified name.
 */
CREATE FUNCTION pgjq._await_ids(queues text[])
RETURNS integer[]
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_await_ids';

CREATE FUNCTION pgjq._await_ready(queue_ids integer[])
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_await_ready';

CREATE PROCEDURE pgjq.await(queues text[], wait interval)
LANGUAGE C
AS 'MODULE_PATHNAME', 'pgjq_await';
COMMENT ON PROCEDURE pgjq.await(text[], interval) IS 'sleep until one of the queues may have a claimable job (or wait ends) without holding a snapshot; then call claim()';

/* ------------------------------------------------------------- outcomes */

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

CREATE FUNCTION pgjq.heartbeat(id bigint, token bigint, extend interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_heartbeat';
COMMENT ON FUNCTION pgjq.heartbeat(bigint, bigint, interval) IS 'extend a lease; returns its new end, NULL when stale or cancelled';

CREATE FUNCTION pgjq.snooze(id bigint, token bigint, delay interval)
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_snooze';
COMMENT ON FUNCTION pgjq.snooze(bigint, bigint, interval) IS 'put a running job back to run after delay without spending an attempt';

CREATE FUNCTION pgjq.cancel(id bigint)
RETURNS boolean
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_cancel';
COMMENT ON FUNCTION pgjq.cancel(bigint) IS 'cancel a scheduled or ready job, or ask a running one to stop';

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

CREATE FUNCTION pgjq.retry_dead(queue text, ids bigint[] DEFAULT NULL)
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_retry_dead';
COMMENT ON FUNCTION pgjq.retry_dead(text, bigint[]) IS 'make dead jobs ready again with fresh attempts; returns how many';

/* ---------------------------------------------------------- maintenance */

CREATE FUNCTION pgjq.promote()
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_promote';
COMMENT ON FUNCTION pgjq.promote() IS 'make due scheduled jobs ready; returns how many';

CREATE FUNCTION pgjq.rescue()
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_rescue';
COMMENT ON FUNCTION pgjq.rescue() IS 'treat running jobs whose lease expired as failed attempts; returns how many';

CREATE FUNCTION pgjq.prune()
RETURNS bigint
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_prune';
COMMENT ON FUNCTION pgjq.prune() IS 'drop finished history past retention, whole partitions at a time; returns partitions removed';

/*
 * Internal: the first statement of every update script (from 0.4.1 on): the
 * extension's lock, so that the background worker steps aside until the
 * update commits (src/worker/bgworker.c).  Superuser only.
 */
CREATE FUNCTION pgjq._exclude_worker()
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_exclude_worker';

CREATE FUNCTION pgjq.maintain(OUT promoted bigint, OUT rescued bigint, OUT pruned bigint)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_maintain';
COMMENT ON FUNCTION pgjq.maintain() IS 'promote(), rescue() and prune() in one call';

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

/* -------------------------------------------------------- observability */

CREATE TYPE pgjq.job_info AS (
	id				bigint,
	queue			text,
	state			text,
	attempt			integer,
	max_attempts	integer,
	priority		smallint,
	fair_key		text,
	dedup_key		text,
	payload			jsonb,
	enqueued_at		timestamptz,
	run_at			timestamptz,
	lease_until		timestamptz,
	finished_at		timestamptz,
	worker			text,
	last_error		text,
	cancel_requested boolean,
	result			jsonb,	/* a completed job's, while it is kept in the history */
	waiting_for		bigint[]	/* a waiting job's dependencies not finished yet */
);
COMMENT ON TYPE pgjq.job_info IS 'what pgjq.job() reports about one job';

/*
 * Internal: the ring engine's view of a job that it holds ready or running
 * (ring_store.c); pgjq.job() asks it last.
 */
CREATE FUNCTION pgjq._ring_job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS 'MODULE_PATHNAME', 'pgjq_ring_job';

/*
 * Internal: under Citus, job(id)'s first branch: the wrong-node error for an
 * id another node issued (citus/ownership.c); no row otherwise.
 */
CREATE FUNCTION pgjq._job_guard(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS 'MODULE_PATHNAME', 'pgjq_job_guard';

CREATE FUNCTION pgjq.job(id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$
	SELECT * FROM pgjq._job_guard($1)
	UNION ALL
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
COMMENT ON FUNCTION pgjq.job(bigint) IS 'a job''s current state, attempts, last error and times, wherever it lives';

CREATE FUNCTION pgjq.wait_jobs(ids bigint[], wait interval, "all" boolean DEFAULT true)
RETURNS TABLE (id bigint, state text, attempt integer, result jsonb)
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_wait_jobs';
COMMENT ON FUNCTION pgjq.wait_jobs(bigint[], interval, boolean) IS 'wait until every listed job (all => false: the first one) is completed, dead or cancelled, or the wait ends (capped by pgjq.max_wait); one row per id with what job(id) says then (state NULL: no such job)';

/*
 * Who holds back the xmin horizon (the oldest transaction vacuum must keep
 * rows for) and for how long: a session, a prepared transaction or a
 * replication slot; and the due jobs the ring engine had no room for (they
 * wait as ready rows of pgjq.job).  For pgjq_admin: as the extension owner
 * it sees the state and times of every role's sessions (never their query
 * text).
 */
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
	OUT gid text,
	OUT ring_refused bigint,
	OUT ring_refused_at timestamptz,
	OUT ring_refused_bound text)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_health';
COMMENT ON FUNCTION pgjq.health() IS 'who holds back the xmin horizon (backend, prepared transaction or replication slot) and its age in transactions and in seconds (seconds NULL when the holder records no start: a slot, a walsender''s feedback; both 0 when nothing holds it); ring_refused: how often since the server started a due job of this database found no room in the ring engine (it waits as a ready row of pgjq.job), the latest at ring_refused_at, for want of ring_refused_bound (queues or lanes)';

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

/* Internal: the shared-memory limit counters (empty without preload). */
CREATE FUNCTION pgjq.verify(
	OUT area text,
	OUT object text,
	OUT expected text,
	OUT found text)
RETURNS SETOF record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_verify';
COMMENT ON FUNCTION pgjq.verify() IS 'cross-check shared memory against the tables and the tables against each other; one row per disagreement, none when healthy (reads every unfinished job and the whole history)';

CREATE FUNCTION pgjq._limits(OUT queue_id integer, OUT running integer, OUT held_back bigint)
RETURNS SETOF record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_limits';

/* Internal: true when pgjq was preloaded (its shared memory exists). */
CREATE FUNCTION pgjq._preloaded()
RETURNS boolean
LANGUAGE C STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_preloaded';

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

CREATE VIEW pgjq.queue_stats WITH (security_barrier) AS
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

/* ------------------------------------------------------- beyond one server */

/*
 * pgjq on a Citus cluster (README, "Beyond one server (Citus)").  Every
 * node keeps its own pgjq (tables, ring, worker); pgjq.citus_setup() makes
 * one small distributed table, pgjq.queue_route, whose shards decide which
 * node serves a queue name, and registers the queue-first functions for
 * Citus's delegation by their first argument.  Nothing below is used on a
 * single server, and nothing of it changes a single server's behaviour.
 *
 * queue_fence (local on every node): the routing shards this node is moving
 * away (pgjq.move_queues); while a row is here, this node refuses enqueues
 * to the shard's queues and serves their claims and outcomes.
 */
CREATE TABLE pgjq.queue_fence (
	shard			bigint PRIMARY KEY,
	target_group	integer NOT NULL,
	state			"char" NOT NULL DEFAULT 'f',	/* 'f' enqueues refused, 's' claims too */
	since			timestamptz NOT NULL DEFAULT pg_catalog.now()
);
COMMENT ON TABLE pgjq.queue_fence IS 'Citus mode: routing shards this node is moving away (private)';

CREATE FUNCTION pgjq._serve(queue text)
RETURNS void
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_serve';

CREATE FUNCTION pgjq.route(queue text, OUT node_name text, OUT node_port integer,
						   OUT group_id integer, OUT shard bigint)
RETURNS record
LANGUAGE C VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_route';
COMMENT ON FUNCTION pgjq.route(text) IS 'Citus mode: the node that serves the queue (connect there to skip the hop), its group and routing shard';

/*
 * The queue-first forms: the queue routes the call (Citus delegates by it),
 * the ids and tokens name the jobs as in the plain forms, which they call.
 * Named *_in rather than overloads of complete/fail/heartbeat: with
 * untyped parameters (node-pg, asyncpg's inference) an overload whose first
 * argument is text would capture today's complete($1, $2, $3).
 */
CREATE FUNCTION pgjq.complete_in(queue text, ids bigint[], tokens bigint[], results jsonb[] DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.complete(ids, tokens, results) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.complete_in(text, bigint[], bigint[], jsonb[]) IS 'complete(ids, tokens, results) routed by queue (Citus); returns how many were completed';

CREATE FUNCTION pgjq.fail_in(queue text, id bigint, token bigint, error text DEFAULT NULL,
							 retry_in interval DEFAULT NULL, hold_key_for interval DEFAULT NULL)
RETURNS text
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.fail(id, token, error, retry_in, hold_key_for) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.fail_in(text, bigint, bigint, text, interval, interval) IS 'fail(id, token, ...) routed by queue (Citus)';

CREATE FUNCTION pgjq.heartbeat_in(queue text, id bigint, token bigint, extend interval DEFAULT NULL)
RETURNS timestamptz
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.heartbeat(id, token, extend) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.heartbeat_in(text, bigint, bigint, interval) IS 'heartbeat(id, token, extend) routed by queue (Citus)';

CREATE FUNCTION pgjq.snooze_in(queue text, id bigint, token bigint, delay interval)
RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.snooze(id, token, delay) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.snooze_in(text, bigint, bigint, interval) IS 'snooze(id, token, delay) routed by queue (Citus)';

CREATE FUNCTION pgjq.cancel_in(queue text, ids bigint[])
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pgjq.cancel_many(ids) FROM pgjq._serve(queue) $$;
COMMENT ON FUNCTION pgjq.cancel_in(text, bigint[]) IS 'cancel_many(ids) routed by queue (Citus)';

CREATE FUNCTION pgjq.job_in(queue text, id bigint)
RETURNS SETOF pgjq.job_info
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
ROWS 1
AS $$ SELECT j.* FROM pgjq._serve(queue), pgjq.job(id) j $$;
COMMENT ON FUNCTION pgjq.job_in(text, bigint) IS 'job(id) routed by queue (Citus)';

/*
 * Run on every node by citus_setup(): this node's ids and tokens start at
 * (group + 1) << 48, so an id names the node that issued it (and ids never
 * repeat across nodes); each node's range ends before the next one's.  A
 * group past the last range, or a sequence already past this node's range
 * (a dump of another node restored here), is refused.
 */
CREATE FUNCTION pgjq._citus_node_setup()
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	g integer := (SELECT groupid FROM pg_catalog.pg_dist_local_group);
	lo bigint;
	hi bigint;
BEGIN
	IF g < 0 OR g >= 32767 THEN
		RAISE EXCEPTION 'group % has no id range: pgjq gives ranges to groups 0 to 32766', g
			USING ERRCODE = 'program_limit_exceeded';
	END IF;
	lo := (g::bigint + 1) << 48;
	hi := lo + ((1::bigint << 48) - 1);
	IF (SELECT last_value FROM pgjq.job_id_seq) > hi OR (SELECT last_value FROM pgjq.token_seq) > hi THEN
		RAISE EXCEPTION 'the id sequences of group % are past its range (% to %)', g, lo, hi
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = pg_catalog.format('job_id_seq is at %s, token_seq at %s: ids of another node were restored here?',
											 (SELECT last_value FROM pgjq.job_id_seq), (SELECT last_value FROM pgjq.token_seq)),
				  HINT = 'Restore a node''s dump only into a node of the same group, or move its jobs off and set the sequences back by hand.';
	END IF;
	IF (SELECT last_value FROM pgjq.job_id_seq) < lo THEN
		PERFORM pg_catalog.setval('pgjq.job_id_seq', lo, false);
	END IF;
	IF (SELECT last_value FROM pgjq.token_seq) < lo THEN
		PERFORM pg_catalog.setval('pgjq.token_seq', lo, false);
	END IF;
	EXECUTE pg_catalog.format('ALTER SEQUENCE pgjq.job_id_seq MAXVALUE %s', hi);
	EXECUTE pg_catalog.format('ALTER SEQUENCE pgjq.token_seq MAXVALUE %s', hi);
	RETURN pg_catalog.format('group %s: ids from %s', g, lo);
END
$$;

/*
 * The rebalance strategy citus_setup() makes Citus's default: Citus's
 * by_shard_count, except that a shard colocated with pgjq.queue_route stays
 * on the node that holds it (moving it would leave its queues' jobs on the
 * old node: pgjq.move_queues() moves queues).
 */
CREATE FUNCTION pgjq.routing_shard_allowed_on_node(shardid bigint, nodeid integer)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp
AS $$
	SELECT NOT EXISTS (
		SELECT 1
		  FROM pg_catalog.pg_dist_shard s
		  JOIN pg_catalog.pg_dist_partition p ON p.logicalrelid = s.logicalrelid
		  JOIN pg_catalog.pg_dist_partition r ON r.colocationid = p.colocationid
		 WHERE s.shardid = $1 AND r.logicalrelid = 'pgjq.queue_route'::pg_catalog.regclass)
	OR EXISTS (
		SELECT 1 FROM pg_catalog.pg_dist_placement pl JOIN pg_catalog.pg_dist_node n ON n.groupid = pl.groupid
		 WHERE pl.shardid = $1 AND n.nodeid = $2)
$$;
COMMENT ON FUNCTION pgjq.routing_shard_allowed_on_node(bigint, integer) IS 'Citus mode: the shard_allowed_on_node_function of the rebalance strategy pgjq_keeps_queues: a shard colocated with pgjq.queue_route stays on the node that holds it (pgjq.move_queues() moves queues)';

CREATE FUNCTION pgjq.citus_setup(shard_count integer DEFAULT 32)
RETURNS TABLE (node_name text, node_port integer, group_id integer, result text)
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	f regprocedure;
	n record;
	strat record;
	r record;
BEGIN
	IF NOT coalesce((SELECT a.rolsuper FROM pg_catalog.pg_roles a WHERE a.rolname = current_user), false) THEN
		RAISE EXCEPTION 'citus_setup() is for a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'It distributes a table and functions with Citus and sets every node''s id range.';
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
		RAISE EXCEPTION 'citus_setup() needs the citus extension in this database'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Preload citus on every node (shared_preload_libraries = ''citus,pgjq''), then CREATE EXTENSION citus.';
	END IF;
	IF (SELECT groupid FROM pg_catalog.pg_dist_local_group) <> 0 THEN
		RAISE EXCEPTION 'citus_setup() runs on the coordinator'
			USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF shard_count IS NULL OR shard_count < 1 OR shard_count > 64000 THEN
		RAISE EXCEPTION 'shard_count must be between 1 and 64000'
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT d.nodename, d.nodeport INTO n FROM pg_catalog.pg_dist_node d
	 WHERE d.isactive AND d.noderole = 'primary' AND d.groupid <> 0
	   AND NOT (d.hasmetadata AND d.metadatasynced)
	 ORDER BY d.nodeid LIMIT 1;
	IF FOUND THEN
		RAISE EXCEPTION 'metadata sync is off for node %:%', n.nodename, n.nodeport
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  DETAIL = 'pgjq routes calls with Citus''s function delegation, which needs every node''s metadata.',
				  HINT = pg_catalog.format('SELECT citus_activate_node(%L, %s);', n.nodename, n.nodeport);
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_node d WHERE d.isactive AND d.noderole = 'primary' AND d.groupid <> 0) THEN
		RAISE EXCEPTION 'the cluster has no worker node'
			USING ERRCODE = 'object_not_in_prerequisite_state',
				  HINT = 'Add one with citus_add_node(host, port).';
	END IF;

	IF pg_catalog.to_regclass('pgjq.queue_route') IS NULL THEN
		CREATE TABLE pgjq.queue_route (queue text PRIMARY KEY);
		COMMENT ON TABLE pgjq.queue_route IS 'Citus mode: the shard a queue name hashes to decides the node that serves it (no rows needed)';
		PERFORM pg_catalog.create_distributed_table('pgjq.queue_route', 'queue',
													shard_count := shard_count, colocate_with := 'none');
	END IF;

	/* every function whose first argument is the queue */
	FOR f IN
		SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
		 WHERE p.pronamespace = 'pgjq'::regnamespace AND p.prokind = 'f'
		   AND p.pronargs > 0 AND p.proargtypes[0] = 'text'::regtype
		   AND p.proname IN ('create_queue', 'alter_queue', 'drop_queue', 'pause', 'resume', 'purge',
							 'retry_dead', 'enqueue', 'enqueue_many', 'claim', 'complete_and_claim',
							 'hold_key', 'release_key', 'cancel_key', 'complete_in', 'fail_in',
							 'heartbeat_in', 'snooze_in', 'cancel_in', 'job_in')
		 ORDER BY 1::text
	LOOP
		PERFORM pg_catalog.create_distributed_function(f, '$1', colocate_with := 'pgjq.queue_route',
													   force_delegation := true);
	END LOOP;

	/* the default strategy as it is, but routing shards stay put */
	IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_rebalance_strategy WHERE name = 'pgjq_keeps_queues') THEN
		SELECT * INTO strat FROM pg_catalog.pg_dist_rebalance_strategy WHERE default_strategy;
		PERFORM pg_catalog.citus_add_rebalance_strategy('pgjq_keeps_queues', strat.shard_cost_function,
			strat.node_capacity_function, 'pgjq.routing_shard_allowed_on_node', strat.default_threshold,
			strat.minimum_threshold, strat.improvement_threshold);
		PERFORM pg_catalog.citus_set_default_rebalance_strategy('pgjq_keeps_queues');
	END IF;

	/* every node's id range: a node that fails stops the setup, named */
	FOR r IN
		SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp, x.success, x.result
		  FROM pg_catalog.run_command_on_all_nodes('SELECT pgjq._citus_node_setup()') x
		  JOIN pg_catalog.pg_dist_node d ON d.nodeid = x.nodeid
		 ORDER BY d.groupid
	LOOP
		IF NOT r.success THEN
			RAISE EXCEPTION 'node %:% (group %) could not be given its id range: %', r.host, r.port, r.grp, r.result
				USING ERRCODE = 'object_not_in_prerequisite_state',
					  HINT = 'Fix that node, then run citus_setup() again (it is idempotent).';
		END IF;
		node_name := r.host;
		node_port := r.port;
		group_id := r.grp;
		result := r.result;
		RETURN NEXT;
	END LOOP;
END
$$;
COMMENT ON FUNCTION pgjq.citus_setup(integer) IS 'Citus mode: make pgjq.queue_route, delegate the queue-first functions by their queue, give every node its id range; run once on the coordinator (again after adding a node)';

/* ---------------------------------------------- moves (pgjq.move_queues) */

CREATE FUNCTION pgjq._citus_fence(shard bigint, target_group integer, state "char")
RETURNS integer
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_fence';

CREATE FUNCTION pgjq._citus_unfence(shard bigint)
RETURNS boolean
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_unfence';

CREATE FUNCTION pgjq._citus_lock_shard(shard bigint)
RETURNS integer
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_lock_shard';

CREATE FUNCTION pgjq._citus_history_ensure(finished_at timestamptz)
RETURNS void
LANGUAGE C VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS 'MODULE_PATHNAME', 'pgjq_citus_history_ensure';

/* this node's queues of a routing shard, with their settings */
CREATE FUNCTION pgjq._citus_shard_queues(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(jsonb_agg(to_jsonb(q) - 'queue_id' - 'created_at' ORDER BY q.name), '[]')
	  FROM pgjq.queue q
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, q.name) = $1
$$;

/*
 * What this node's queues of a routing shard still hold (a look without
 * locks, for the drain's progress), and why a queue could never drain:
 * paused with jobs, or a key held in force while it has jobs.
 */
CREATE FUNCTION pgjq._citus_shard_jobs(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT jsonb_build_object('unfinished', coalesce(sum(s.ready + s.scheduled + s.running + s.waiting), 0),
							  'dead', coalesce(sum(s.dead), 0), 'queues', count(*),
							  'schedules', (SELECT count(*) FROM pgjq.schedules p
											 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, p.queue) = $1),
							  'stuck', coalesce(jsonb_agg(
									CASE WHEN s.paused THEN format('queue %s is paused', quote_ident(s.queue))
										 ELSE format('queue %s has %s held keys', quote_ident(s.queue), s.held_keys) END
									ORDER BY s.queue)
								FILTER (WHERE s.ready + s.scheduled + s.waiting > 0 AND (s.paused OR s.held_keys > 0)), '[]'))
	  FROM pgjq.queue_stats s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = $1
$$;

/*
 * Everything live in this node's queues of a routing shard, counted under
 * the shard's queue-name locks and the promotion lock (_citus_lock_shard,
 * held to the caller's transaction's end): rows of pgjq.job (scheduled,
 * ready, waiting, dedup anchors) and the ring's ready and running jobs.
 * The count is a statement after the locks: its snapshot sees every call
 * that held them committed, and every promotion published.
 */
CREATE FUNCTION pgjq._citus_shard_live(shard bigint)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r jsonb;
BEGIN
	PERFORM pgjq._citus_lock_shard(shard);
	SELECT jsonb_build_object('live', coalesce(sum(x.jobs + x.ready + x.running), 0),
							  'jobs', coalesce(sum(x.jobs), 0), 'ready', coalesce(sum(x.ready), 0),
							  'running', coalesce(sum(x.running), 0),
							  'detail', coalesce(string_agg(format('queue %s: %s rows of pgjq.job, %s ready and %s running in the ring',
																   quote_ident(x.name), x.jobs, x.ready, x.running), '; ' ORDER BY x.name)
												 FILTER (WHERE x.jobs + x.ready + x.running > 0), ''))
	  INTO r
	  FROM (SELECT q.name,
				   (SELECT count(*) FROM pgjq.job j WHERE j.queue_id = q.queue_id) AS jobs,
				   coalesce(c.ready, 0) AS ready, coalesce(c.running, 0) AS running
			  FROM pgjq.queue q
			  LEFT JOIN pgjq._ring_counts() c ON c.queue_id = q.queue_id
			 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, q.name) = shard) x;
	RETURN r;
END
$$;

/*
 * What this node's queues of a routing shard keep besides jobs, to carry
 * (step 4): dead jobs, dedup_for periods and key holds still in force.
 * Completed and cancelled jobs' history stays behind.
 */
CREATE FUNCTION pgjq._citus_shard_state(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	WITH q AS (SELECT queue_id, name FROM pgjq.queue
				WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, name) = $1)
	SELECT jsonb_build_object(
		'queues', (SELECT coalesce(jsonb_agg(q.name ORDER BY q.name), '[]') FROM q),
		'dead', (SELECT coalesce(jsonb_agg(to_jsonb(h) - 'queue_id' || jsonb_build_object('queue', q.name) ORDER BY h.id), '[]')
				   FROM pgjq.job_history h JOIN q ON q.queue_id = h.queue_id WHERE h.state = 'd'),
		'dedup', (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', q.name, 'dedup_key', d.dedup_key,
															   'job_id', d.job_id, 'until', d.until) ORDER BY q.name, d.dedup_key), '[]')
					FROM pgjq.dedup_period d JOIN q ON q.queue_id = d.queue_id WHERE d.until > now()),
		'holds', (SELECT coalesce(jsonb_agg(jsonb_build_object('queue', q.name, 'fair_key', k.fair_key,
															   'until', k.until) ORDER BY q.name, k.fair_key), '[]')
					FROM pgjq.key_holds k JOIN q ON q.queue_id = k.queue_id WHERE k.until > now()))
$$;

/* this node's schedules of a routing shard's queues, with their slots (step 6) */
CREATE FUNCTION pgjq._citus_shard_schedules(shard bigint)
RETURNS jsonb
LANGUAGE sql STABLE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
	SELECT coalesce(jsonb_agg(to_jsonb(s) ORDER BY s.name), '[]')
	  FROM pgjq.schedules s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = $1
$$;

/*
 * The target's copies of the queues (step 2; the guard is off: it does not
 * serve them yet): made, or brought to the source's settings and paused
 * state where a copy is left from an earlier move.
 */
CREATE FUNCTION pgjq._citus_adopt_queues(queues jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	q jsonb;
	n integer := 0;
BEGIN
	FOR q IN SELECT jsonb_array_elements(queues) LOOP
		IF EXISTS (SELECT 1 FROM pgjq.queue WHERE name = q->>'name') THEN
			/* 0 removes a limit: alter_queue's NULL would keep a stale one */
			PERFORM pgjq.alter_queue(q->>'name', (q->>'lease')::interval, (q->>'max_attempts')::integer,
									 (q->>'backoff_base')::interval, (q->>'backoff_max')::interval,
									 (q->>'retention')::interval, coalesce((q->>'concurrency')::integer, 0),
									 coalesce((q->>'key_concurrency')::integer, 0),
									 coalesce((q->>'rate')::double precision, 0),
									 coalesce((q->>'burst')::integer, 0), coalesce((q->>'timeout')::interval, '0'),
									 coalesce((q->>'key_rate')::double precision, 0),
									 coalesce((q->>'key_burst')::integer, 0));
			IF (q->>'paused')::boolean IS DISTINCT FROM
			   (SELECT paused FROM pgjq.queue WHERE name = q->>'name') THEN
				IF (q->>'paused')::boolean THEN
					PERFORM pgjq.pause(q->>'name');
				ELSE
					PERFORM pgjq.resume(q->>'name');
				END IF;
			END IF;
			CONTINUE;
		END IF;
		PERFORM pgjq.create_queue(q->>'name', (q->>'lease')::interval, (q->>'max_attempts')::integer,
								  (q->>'backoff_base')::interval, (q->>'backoff_max')::interval,
								  (q->>'retention')::interval, (q->>'concurrency')::integer,
								  (q->>'key_concurrency')::integer, (q->>'rate')::double precision,
								  (q->>'burst')::integer, (q->>'timeout')::interval,
								  (q->>'key_rate')::double precision, (q->>'key_burst')::integer);
		IF (q->>'paused')::boolean THEN
			PERFORM pgjq.pause(q->>'name');
		END IF;
		n := n + 1;
	END LOOP;
	RETURN n;
END
$$;

/*
 * The source's state (_citus_shard_state, carried) on the target's copies (step 4),
 * idempotently.  exact (before the switch, when the target does not serve
 * the queues yet): the copies end with exactly the source's dead jobs,
 * periods and holds.  Otherwise (finishing a move after its switch, the
 * target serving): only what the target has nowhere (a dead job whose id
 * it knows in any state is not brought back), and no period or hold of the
 * target's is replaced.  A carried dead job keeps its id and finish time;
 * its history partition is made where missing and counts its queue.
 */
CREATE FUNCTION pgjq._citus_adopt_state(carried jsonb, exact boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	r jsonb;
	h pgjq.job_history;
	qid integer;
	part name;
	nd integer := 0;
	np integer := 0;
	nk integer := 0;
BEGIN
	IF exact THEN
		DELETE FROM pgjq.job_history x USING pgjq.queue q
		 WHERE x.queue_id = q.queue_id AND x.state = 'd'
		   AND q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
		   AND x.id NOT IN (SELECT (e->>'id')::bigint FROM jsonb_array_elements(carried->'dead') e);
		DELETE FROM pgjq.dedup_period x USING pgjq.queue q
		 WHERE x.queue_id = q.queue_id AND q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
		   AND (q.name, x.dedup_key) NOT IN (SELECT e->>'queue', e->>'dedup_key' FROM jsonb_array_elements(carried->'dedup') e);
		PERFORM pgjq.release_key(q.name, nullif(k.fair_key, ''))
		   FROM pgjq.key_holds k JOIN pgjq.queue q ON q.queue_id = k.queue_id
		  WHERE q.name IN (SELECT jsonb_array_elements_text(carried->'queues'))
			AND (q.name, k.fair_key::text) NOT IN (SELECT e->>'queue', e->>'fair_key' FROM jsonb_array_elements(carried->'holds') e);
	END IF;
	FOR r IN SELECT jsonb_array_elements(carried->'dead') LOOP
		SELECT queue_id INTO qid FROM pgjq.queue WHERE name = r->>'queue';
		IF NOT FOUND THEN
			RAISE EXCEPTION 'queue "%" does not exist here to take its dead jobs', r->>'queue'
				USING ERRCODE = 'undefined_object';
		END IF;
		CONTINUE WHEN EXISTS (SELECT 1 FROM pgjq.job_history x WHERE x.id = (r->>'id')::bigint)
			OR (NOT exact AND EXISTS (SELECT 1 FROM pgjq.job((r->>'id')::bigint)));
		h := jsonb_populate_record(NULL::pgjq.job_history, r || jsonb_build_object('queue_id', qid));
		PERFORM pgjq._citus_history_ensure(h.finished_at);
		INSERT INTO pgjq.job_history SELECT h.*;
		/* a closed partition lists its queues for prune(): this one too */
		SELECT c.relname INTO part FROM pgjq.job_history x JOIN pg_class c ON c.oid = x.tableoid WHERE x.id = h.id;
		UPDATE pgjq.history_partition p SET queue_ids = p.queue_ids || qid
		 WHERE p.relname = part AND p.queue_ids IS NOT NULL AND NOT (qid = ANY (p.queue_ids));
		nd := nd + 1;
	END LOOP;
	FOR r IN SELECT jsonb_array_elements(carried->'dedup') LOOP
		INSERT INTO pgjq.dedup_period (queue_id, dedup_key, job_id, until)
		SELECT q.queue_id, r->>'dedup_key', (r->>'job_id')::bigint, (r->>'until')::timestamptz
		  FROM pgjq.queue q WHERE q.name = r->>'queue'
		ON CONFLICT (queue_id, dedup_key) DO UPDATE SET job_id = excluded.job_id, until = excluded.until
		 WHERE exact;
		np := np + 1;
	END LOOP;
	FOR r IN SELECT jsonb_array_elements(carried->'holds') LOOP
		CONTINUE WHEN NOT exact AND EXISTS (SELECT 1 FROM pgjq.key_holds k JOIN pgjq.queue q ON q.queue_id = k.queue_id
											 WHERE q.name = r->>'queue' AND k.fair_key = r->>'fair_key');
		PERFORM pgjq.hold_key(r->>'queue', nullif(r->>'fair_key', ''), (r->>'until')::timestamptz);
		nk := nk + 1;
	END LOOP;
	RETURN format('%s dead jobs, %s dedup periods, %s key holds', nd, np, nk);
END
$$;

/*
 * The source's schedules on the target (step 6, the target serving the
 * queues): a schedule the target has already is kept as it is (it may have
 * fired since); one of that name for another queue stops the move.
 */
CREATE FUNCTION pgjq._citus_adopt_schedules(schedules jsonb)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r jsonb;
	other text;
	n integer := 0;
BEGIN
	FOR r IN SELECT jsonb_array_elements(schedules) LOOP
		INSERT INTO pgjq.schedules (name, cron, queue, payload, time_zone, catch_up, next_slot, last_slot, created_at)
		SELECT s.name, s.cron, s.queue, s.payload, s.time_zone, s.catch_up, s.next_slot, s.last_slot, s.created_at
		  FROM jsonb_populate_record(NULL::pgjq.schedules, r) s
		ON CONFLICT (name) DO NOTHING;
		SELECT queue INTO other FROM pgjq.schedules WHERE name = r->>'name';
		IF other IS DISTINCT FROM r->>'queue' THEN
			RAISE EXCEPTION 'a schedule named "%" for queue "%" exists here already', r->>'name', other
				USING ERRCODE = 'duplicate_object',
					  HINT = 'unschedule() one of them, then call move_queues() again to finish the move.';
		END IF;
		n := n + 1;
	END LOOP;
	RETURN n;
END
$$;

/*
 * Drop this node's queues of a routing shard (their schedules and carried
 * dead jobs with them), then its fence; only when they hold nothing live,
 * counted under their locks (_citus_shard_live): else SQLSTATE 55006 and
 * nothing is dropped, the fence kept.  Run where the queues are copies or
 * have been carried: the source after the switch, a target given up, a
 * node left fenced by a move cut short.
 */
CREATE FUNCTION pgjq._citus_release_queues(shard bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE STRICT SECURITY DEFINER SET search_path = pg_catalog, pg_temp
SET pgjq.citus_guard = off
AS $$
DECLARE
	live jsonb;
	q record;
	n integer := 0;
BEGIN
	live := pgjq._citus_shard_live(shard);
	IF (live->>'live')::bigint > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % still hold % live jobs here: nothing is dropped', shard, live->>'live'
			USING ERRCODE = 'object_in_use', DETAIL = live->>'detail',
				  HINT = 'The fence stays.  A move drops a node''s queues only once they are empty; see where these jobs came from (pgjq.route() names the node that serves the queue).';
	END IF;
	DELETE FROM pgjq.schedules s
	 WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, s.queue) = shard;
	FOR q IN SELECT queue_id, name FROM pgjq.queue
			  WHERE get_shard_id_for_distribution_column('pgjq.queue_route'::regclass, name) = shard
			  ORDER BY name LOOP
		DELETE FROM pgjq.job_history h WHERE h.queue_id = q.queue_id AND h.state = 'd';
		PERFORM pgjq.drop_queue(q.name, false);
		n := n + 1;
	END LOOP;
	PERFORM pgjq._citus_unfence(shard);
	RETURN n;
END
$$;

/* run one statement on one node (its own connection and transaction) */
CREATE FUNCTION pgjq._citus_on(node_name text, node_port integer, command text)
RETURNS text
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
	r record;
BEGIN
	SELECT * INTO r FROM master_run_on_worker(ARRAY[node_name], ARRAY[node_port], ARRAY[command], false);
	IF NOT r.success THEN
		RAISE EXCEPTION 'on node %:%: %', node_name, node_port, r.result
			USING ERRCODE = CASE WHEN r.result LIKE '%nothing is dropped%' THEN 'object_in_use'
								 ELSE 'connection_exception' END;
	END IF;
	RETURN r.result;
END
$$;

/*
 * A move cut short after its switch, finished: the fenced node's state and
 * schedules to the node that holds the shard now (only what it has
 * nowhere: step 4 may not have run if the shard was moved outside
 * move_queues; a key hold released there since step 4 comes back until its
 * end), then its queues dropped (only if empty) and its fence.
 */
CREATE FUNCTION pgjq._citus_finish_on(shard bigint, from_host text, from_port integer, to_host text, to_port integer)
RETURNS void
LANGUAGE plpgsql VOLATILE STRICT SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
	PERFORM pgjq._citus_on(to_host, to_port, format('SELECT pgjq._citus_adopt_state(%L, false)',
		pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_shard_state(%s)', shard))));
	PERFORM pgjq._citus_on(to_host, to_port, format('SELECT pgjq._citus_adopt_schedules(%L)',
		pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_shard_schedules(%s)', shard))));
	PERFORM pgjq._citus_on(from_host, from_port, format('SELECT pgjq._citus_release_queues(%s)', shard));
END
$$;

CREATE PROCEDURE pgjq.move_queues(shard bigint, node_name text, node_port integer,
								  drain_wait interval DEFAULT '1 minute')
LANGUAGE plpgsql
AS $$
DECLARE
	src record;
	tgt record;
	n record;
	qs jsonb;
	st jsonb;
	live jsonb;
	g integer;
	deadline timestamptz;
	fenced "char" := 'f';
	stop_after integer;
	lock_key integer;
	holder text;
BEGIN
	/*
	 * A procedure that commits cannot have a SET clause: the search_path is
	 * set for each of its transactions instead (COMMIT resets it).
	 */
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF NOT coalesce((SELECT r.rolsuper FROM pg_roles r WHERE r.rolname = current_user), false) THEN
		RAISE EXCEPTION 'move_queues() is for a superuser'
			USING ERRCODE = 'insufficient_privilege',
				  DETAIL = 'It runs pgjq''s steps on every node and moves Citus shards (citus_move_shard_placement).';
	END IF;
	IF to_regclass('pgjq.queue_route') IS NULL THEN
		RAISE EXCEPTION 'this database is not in pgjq''s Citus mode'
			USING ERRCODE = 'object_not_in_prerequisite_state', HINT = 'Run SELECT pgjq.citus_setup() first.';
	END IF;
	IF (SELECT groupid FROM pg_dist_local_group) <> 0 THEN
		RAISE EXCEPTION 'move_queues() runs on the coordinator' USING ERRCODE = 'object_not_in_prerequisite_state';
	END IF;
	IF shard IS NULL OR NOT EXISTS (SELECT 1 FROM pg_dist_shard s WHERE s.shardid = shard
									 AND s.logicalrelid = 'pgjq.queue_route'::regclass) THEN
		RAISE EXCEPTION 'shard % is not a shard of pgjq.queue_route', shard
			USING ERRCODE = 'invalid_parameter_value', HINT = 'pgjq.route(queue) names the shard of a queue.';
	END IF;
	IF drain_wait IS NULL OR drain_wait < '0' THEN
		RAISE EXCEPTION 'drain_wait must not be negative' USING ERRCODE = 'invalid_parameter_value';
	END IF;
	SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp INTO tgt FROM pg_dist_node d
	 WHERE d.nodename = node_name AND d.nodeport = node_port AND d.noderole = 'primary' AND d.isactive;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'no active primary node %:% in the cluster', node_name, node_port
			USING ERRCODE = 'invalid_parameter_value';
	END IF;
	stop_after := coalesce(nullif(current_setting('pgjq.debug_move_stop_after', true), ''), '0')::integer;

	/*
	 * One move of a shard at a time: a session lock on the coordinator,
	 * held across the procedure's commits.  This session may hold it
	 * already (an earlier call of it stopped by an error): it goes on.
	 */
	lock_key := (shard % 2147483647)::integer;
	IF NOT EXISTS (SELECT 1 FROM pg_locks l
					WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted
					  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
					  AND l.classid::bigint = 1886022006 AND l.objid::bigint = lock_key AND l.objsubid = 2) THEN
		IF NOT pg_try_advisory_lock(1886022006, lock_key) THEN
			SELECT string_agg(l.pid::text, ', ') INTO holder FROM pg_locks l
			 WHERE l.locktype = 'advisory' AND l.granted AND l.classid::bigint = 1886022006
			   AND l.objid::bigint = lock_key AND l.objsubid = 2;
			RAISE EXCEPTION 'routing shard % is being moved by another move_queues() call', shard
				USING ERRCODE = 'object_in_use',
					  DETAIL = format('The session with process id %s on the coordinator holds the shard''s move lock.', holder),
					  HINT = 'Wait for that call to end (or end that session), then call move_queues() again.';
		END IF;
	END IF;

	SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp INTO src
	  FROM pg_dist_placement p JOIN pg_dist_node d ON d.groupid = p.groupid AND d.noderole = 'primary'
	 WHERE p.shardid = shard ORDER BY p.placementid LIMIT 1;

	/*
	 * Moves cut short: a fence on a node other than the one that holds the
	 * shard.  Toward that node: the move's switch was done, its last step
	 * not: finish it (carry what the fenced node keeps, drop its empty
	 * queues, lift the fence).  Toward any other: the shard went elsewhere
	 * behind pgjq's back; stop.
	 */
	FOR n IN SELECT d.nodename::text AS host, d.nodeport AS port, d.groupid AS grp, r.success, r.result
			   FROM run_command_on_all_nodes(format('SELECT coalesce(string_agg(target_group::text, '',''), '''') FROM pgjq.queue_fence WHERE shard = %s', shard)) r
			   JOIN pg_dist_node d ON d.nodeid = r.nodeid
			  WHERE d.groupid <> src.grp ORDER BY d.groupid LOOP
		IF NOT n.success THEN
			RAISE EXCEPTION 'node %:% could not be reached to look for fences of routing shard %: %', n.host, n.port, shard, n.result
				USING ERRCODE = 'connection_exception';
		END IF;
		CONTINUE WHEN n.result = '';
		IF n.result::integer <> src.grp THEN
			RAISE EXCEPTION 'node %:% has a fence of routing shard % toward group %, but the shard is on group %', n.host, n.port, shard, n.result, src.grp
				USING ERRCODE = 'object_in_use',
					  DETAIL = 'A move of the shard was cut short and the shard was moved since, outside move_queues().',
					  HINT = 'Look at that node''s queues of the shard (pgjq._citus_shard_live) before you lift its fence by hand.';
		END IF;
		PERFORM pgjq._citus_finish_on(shard, n.host, n.port, src.host, src.port);
		RAISE NOTICE 'routing shard % was already on %:%; its queues on %:% are dropped now', shard, src.host, src.port, n.host, n.port;
	END LOOP;
	IF src.grp = tgt.grp THEN
		PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_unfence(%s)', shard));
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);

	st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
	IF jsonb_array_length(st->'stuck') > 0 THEN
		RAISE EXCEPTION 'the queues of routing shard % cannot drain: %', shard,
				(SELECT string_agg(e, ', ') FROM jsonb_array_elements_text(st->'stuck') e)
			USING ERRCODE = 'object_in_use',
				  DETAIL = 'A move waits until the source''s queues hold no job; no claim takes the jobs of a paused queue or of a held key.',
				  HINT = 'resume() the queue or release_key() the keys (or wait until their jobs ran), then move the queues.';
	END IF;

	/* 1. fence the source */
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''f'')', shard, tgt.grp));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 1 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 1 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 2. the queues on the target */
	qs := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_queues(%s)', shard))::jsonb;
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_queues(%L)', qs));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 2 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 2 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/*
	 * 3. the source finishes what it holds; once it looks empty its claims
	 * are refused too ('s'), and the final check counts under the queues'
	 * and the promotion's locks: jobs it finds besides running ones (a
	 * promotion that had not published, a retry) lift 's' again and the
	 * drain goes on; running ones are waited for under 's'
	 */
	deadline := clock_timestamp() + drain_wait;
	LOOP
		IF fenced = 's' THEN
			live := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_live(%s)', shard))::jsonb;
			EXIT WHEN (live->>'live')::bigint = 0;
			IF (live->>'jobs')::bigint + (live->>'ready')::bigint > 0 THEN
				PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''f'')', shard, tgt.grp));
				fenced := 'f';
			END IF;
		ELSE
			st := pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_jobs(%s)', shard))::jsonb;
			IF (st->>'unfinished')::bigint = 0 THEN
				PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_fence(%s, %s, ''s'')', shard, tgt.grp));
				fenced := 's';
				CONTINUE;
			END IF;
		END IF;
		IF clock_timestamp() >= deadline THEN
			/* never release queues on a node that holds the shard (moved behind pgjq's back) */
			SELECT p.groupid INTO g FROM pg_dist_placement p WHERE p.shardid = shard ORDER BY p.placementid LIMIT 1;
			IF g IS DISTINCT FROM src.grp THEN
				RAISE EXCEPTION 'routing shard % was moved to group % outside move_queues() while its queues on %:% were drained: nothing is dropped', shard, g, src.host, src.port
					USING ERRCODE = 'object_in_use',
						  DETAIL = 'The fence stays; the queues on both nodes keep their jobs.',
						  HINT = 'Once the queues on the old node are empty, call move_queues() toward the node that holds the shard to finish.';
			END IF;
			PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
			PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_unfence(%s)', shard));
			PERFORM pg_advisory_unlock(1886022006, lock_key);
			RAISE EXCEPTION 'the queues of routing shard % still hold % unfinished and % dead jobs after %: nothing moved',
					shard, coalesce(st->>'unfinished', live->>'live'), coalesce(st->>'dead', '0'), drain_wait
				USING ERRCODE = 'object_in_use',
					  DETAIL = 'Enqueues were refused with SQLSTATE PJ002 while the move waited; they are taken again.',
					  HINT = 'Delayed and waiting jobs keep a queue on its node until they run: try again later, or with a longer drain_wait.';
		END IF;
		PERFORM pg_sleep(0.05);
	END LOOP;
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 3 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 3 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 4. what the queues keep besides jobs (the source frozen under 's') */
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_state(%L, true)',
		pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_state(%s)', shard))));
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 4 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 4 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/* 5. Citus moves the shard group; from its commit calls go to the target */
	PERFORM citus_move_shard_placement(shard, src.host, src.port, tgt.host, tgt.port,
									   shard_transfer_mode := 'block_writes');
	COMMIT;
	PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
	IF stop_after = 5 THEN
		RAISE NOTICE 'move of routing shard % stopped after step 5 (pgjq.debug_move_stop_after)', shard;
		PERFORM pg_advisory_unlock(1886022006, lock_key);
		RETURN;
	END IF;

	/*
	 * 6. the schedules to the target; the source's empty queues and its
	 * fence (the rest was carried at step 4: a hold released on the target
	 * since must not come back)
	 */
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_adopt_schedules(%L)',
		pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_shard_schedules(%s)', shard))));
	PERFORM pgjq._citus_on(src.host, src.port, format('SELECT pgjq._citus_release_queues(%s)', shard));
	PERFORM pgjq._citus_on(tgt.host, tgt.port, format('SELECT pgjq._citus_unfence(%s)', shard));
	PERFORM pg_advisory_unlock(1886022006, lock_key);
	RAISE NOTICE 'routing shard % moved from %:% to %:% with % queues', shard, src.host, src.port,
		tgt.host, tgt.port, jsonb_array_length(qs);
END
$$;
COMMENT ON PROCEDURE pgjq.move_queues(bigint, text, integer, interval) IS 'Citus mode: move the queues of a routing shard (and the application shards colocated with it) to another node, with their dead jobs, dedup_for periods, key holds and schedules: enqueues wait (SQLSTATE PJ002) while the source finishes what it holds; nothing moves if it does not within drain_wait; superuser, on the coordinator; calling it again finishes a move cut short';

/* ----------------------------------------------------------- privileges */

REVOKE ALL ON ALL TABLES IN SCHEMA pgjq FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA pgjq FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgjq FROM PUBLIC;
REVOKE ALL ON ALL PROCEDURES IN SCHEMA pgjq FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
	pgjq.enqueue(text, jsonb, interval, timestamptz, integer, text, text, integer, interval, text, interval, text, interval, bigint[], text),
	pgjq.enqueue_many(text, jsonb[], interval, timestamptz, integer, text[], text[], interval, text, interval, text, interval, jsonb[], text),
	pgjq.cancel(bigint),
	pgjq.cancel_many(bigint[]),
	pgjq.cancel_key(text, text),
	pgjq.job(bigint),
	pgjq.wait_jobs(bigint[], interval, boolean)
TO pgjq_producer;

GRANT EXECUTE ON FUNCTION
	pgjq.claim(text, integer, interval, text, interval),
	pgjq.claim(text[], integer, interval, text, interval),
	pgjq.complete(bigint, bigint, jsonb),
	pgjq.complete(bigint[], bigint[], jsonb[]),
	pgjq.complete_and_claim(text, bigint[], bigint[], integer, interval, text, text[], jsonb[]),
	pgjq.fail(bigint, bigint, text, interval, interval),
	pgjq.hold_key(text, text, timestamptz),
	pgjq.release_key(text, text),
	pgjq.heartbeat(bigint, bigint, interval),
	pgjq.snooze(bigint, bigint, interval),
	pgjq.job(bigint),
	pgjq.wait_jobs(bigint[], interval, boolean)
TO pgjq_worker;
GRANT EXECUTE ON PROCEDURE pgjq.await(text[], interval) TO pgjq_worker;
GRANT EXECUTE ON FUNCTION pgjq._await_ids(text[]), pgjq._await_ready(integer[]) TO pgjq_worker;

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgjq TO pgjq_admin;
GRANT EXECUTE ON ALL PROCEDURES IN SCHEMA pgjq TO pgjq_admin;
/* the worker's lock against DDL: for update scripts, not for callers */
REVOKE EXECUTE ON FUNCTION pgjq._exclude_worker() FROM pgjq_admin;
/* queue_stats calls it as the reader: it shows only counters */
GRANT EXECUTE ON FUNCTION pgjq._limits(), pgjq._preloaded(), pgjq._ring_counts() TO pgjq_producer, pgjq_worker;
GRANT SELECT ON pgjq.queue_stats TO pgjq_producer, pgjq_worker, pgjq_admin;
/* Citus mode: the queue-first forms as their plain forms; route() to both */
GRANT EXECUTE ON FUNCTION
	pgjq.complete_in(text, bigint[], bigint[], jsonb[]),
	pgjq.fail_in(text, bigint, bigint, text, interval, interval),
	pgjq.heartbeat_in(text, bigint, bigint, interval),
	pgjq.snooze_in(text, bigint, bigint, interval)
	TO pgjq_worker;
GRANT EXECUTE ON FUNCTION pgjq.cancel_in(text, bigint[]) TO pgjq_producer;
GRANT EXECUTE ON FUNCTION pgjq.job_in(text, bigint), pgjq.route(text) TO pgjq_producer, pgjq_worker;
/* monitoring: pg_monitor reads the metrics, and nothing else of pgjq */
GRANT USAGE ON SCHEMA pgjq TO pg_monitor;
GRANT EXECUTE ON FUNCTION pgjq.metrics(text), pgjq.metrics_prometheus(text) TO pg_monitor;
